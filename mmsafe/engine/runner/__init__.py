"""mmsafe's runner, chosen by ``runner_type='SafeRunner'`` in a config."""
from .safe_runner import SafeRunner
from .stop import StopTraining

__all__ = ['SafeRunner', 'StopTraining']

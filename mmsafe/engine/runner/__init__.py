"""mmsafe's runner, chosen by ``runner_type='SafeRunner'`` in a config."""
from .safe_runner import SafeRunner
from .stop import (PREEMPTED_EXIT_CODE, Preempted, StopTraining,
                   TrainingPreempted)

__all__ = ['SafeRunner', 'StopTraining', 'Preempted', 'TrainingPreempted',
           'PREEMPTED_EXIT_CODE']

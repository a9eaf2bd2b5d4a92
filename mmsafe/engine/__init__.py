"""Training-safety hooks, optimizer wrappers and the monitoring sync."""
from . import hooks  # noqa: F401
from . import optimizers  # noqa: F401
from .monitor_sync import MonitorSync, monitor_sync_of  # noqa: F401
from .runner import SafeRunner, StopTraining  # noqa: F401
from . import loops  # noqa: F401

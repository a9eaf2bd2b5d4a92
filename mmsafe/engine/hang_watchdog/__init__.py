"""Parts of :class:`~mmsafe.engine.hooks.HangWatchdogHook`: the heartbeat
that the main thread updates, the thread that watches it, the stack dump
and the hang report."""
from .heartbeat import Heartbeat
from .monitor import WatchdogThread
from .report import ABORT_EXIT_CODE, HangReporter

__all__ = ['Heartbeat', 'WatchdogThread', 'HangReporter', 'ABORT_EXIT_CODE']

"""The pieces of one run that mmsafe's hooks, loops and wrappers share.

A hook reaches them through one accessor, in any hook method::

    from mmsafe.engine.run_context import run_context

    context = run_context(runner)
    context.rank_channel        # RankChannel, or None (one process, no store)
    context.resume_plan         # ResumePlan of a resumed run, or None
    monitor_sync_of(runner)     # the MonitorSync to post to (monitor_sync.py)
    modalities_of(runner)       # the run's modalities (engine/modalities.py)

:class:`~mmsafe.engine.runner.SafeRunner` builds a :class:`RunContext`
when it is built and fills it (its MonitorSync, the RankChannel under DDP,
the resume plan when it resumes). Under any other runner (a plain MMEngine
``Runner``) the first call makes a context of local defaults for that
runner and keeps it as long as the runner lives: no rank channel, no
resume plan and no shared MonitorSync (each hook then syncs its own
values). Events are no piece of the context: a hook writes them with
:func:`mmsafe.events.write_event` into ``runner.work_dir``. Nothing is
set on such a runner.

A failed run asks its hooks what they know through two documented
methods, :class:`FailureExplainer` and :class:`CrashReporter`: a hook takes
part by defining the method (no base class needed, no hook class named);
:meth:`RunContext.explain_failure` and :meth:`RunContext.report_crash`
ask the runner's hooks in their order.
"""
import weakref
from typing import Any, Dict, Optional, Protocol, runtime_checkable

#: The attribute under which a runner that owns its context (SafeRunner)
#: holds it.
OWNED_ATTRIBUTE = 'mmsafe_context'


@runtime_checkable
class FailureExplainer(Protocol):
    """A hook that can explain an error that ended the run."""

    def explain_failure(self, runner,
                        exc: BaseException) -> Optional[Dict[str, Any]]:
        """What this hook knows about ``exc``.

        Args:
            runner: the runner whose ``train``/``val``/``test`` raised.
            exc (BaseException): the error.

        Returns:
            dict or None: None when this hook has nothing to say (the next
            hook is asked); else ``error``, the exception to raise in place
            of ``exc`` (``exc`` becomes its ``__cause__``), plus the fields
            of the safety report's root cause.
        """


@runtime_checkable
class CrashReporter(Protocol):
    """A hook that reports a failed run (e.g. writes its report)."""

    def report_crash(self, runner, exc: BaseException,
                     root_cause: Optional[Dict[str, Any]] = None) -> None:
        """Called once the error to raise is known, on every hook that
        defines it.

        Args:
            runner: the runner whose run failed.
            exc (BaseException): the error that ends the run.
            root_cause (dict, optional): rank, iteration, type and message
                of the first failure (another rank's, under DDP).
        """


class RunContext:
    """What the hooks, loops and optimizer wrappers of one run share.

    Args:
        monitor_sync (MonitorSync, optional): the one
            :class:`~mmsafe.engine.monitor_sync.MonitorSync` that every
            mmsafe hook of the run posts to; None: each hook keeps its own
            (:func:`~mmsafe.engine.monitor_sync.monitor_sync_of`).

    Attributes:
        monitor_sync (MonitorSync or None): see above.
        rank_channel (RankChannel or None): the run's side channel between
            ranks (:mod:`mmsafe.engine.rank_channel`), set by the runner
            under DDP when the rendezvous store is reachable.
        resume_plan (ResumePlan or None): how a resumed run continues
            (:mod:`mmsafe.engine.resume_state`), set by the runner's
            ``resume``, carried out by mmsafe's train loops.
        modalities (RunModalities or None): where the run's images, files
            and pairing-sensitive loss terms are, read once from the
            config's ``mmsafe_modalities`` and the model
            (:func:`mmsafe.engine.modalities.modalities_of`).
    """

    def __init__(self, monitor_sync: Optional[Any] = None) -> None:
        self.monitor_sync = monitor_sync
        self.rank_channel: Optional[Any] = None
        self.resume_plan: Optional[Any] = None
        self.modalities: Optional[Any] = None

    def explain_failure(self, runner,
                        exc: BaseException) -> Optional[Dict[str, Any]]:
        """The first answer of the runner's :class:`FailureExplainer`
        hooks, in hook order (None: no hook explains ``exc``)."""
        for hook in runner.hooks:
            if isinstance(hook, FailureExplainer):
                details = hook.explain_failure(runner, exc)
                if details is not None:
                    return details
        return None

    def report_crash(self, runner, exc: BaseException,
                     root_cause: Optional[Dict[str, Any]] = None) -> None:
        """Hand the failure to every :class:`CrashReporter` hook of the
        runner, in hook order."""
        for hook in runner.hooks:
            if isinstance(hook, CrashReporter):
                hook.report_crash(runner, exc, root_cause=root_cause)


_LOCAL: 'weakref.WeakKeyDictionary[Any, RunContext]' = \
    weakref.WeakKeyDictionary()


def run_context(runner) -> RunContext:
    """The :class:`RunContext` of ``runner``'s run.

    Args:
        runner: the runner a hook is registered in (any MMEngine runner).

    Returns:
        RunContext: the runner's own (SafeRunner's), else the context of
        local defaults made for ``runner`` at the first call and kept while
        it lives (an object that cannot be weakly referenced, such as a
        ``SimpleNamespace`` standing in for a runner, gets a new one at
        each call).
    """
    owned = getattr(runner, OWNED_ATTRIBUTE, None)
    if isinstance(owned, RunContext):
        return owned
    try:
        return _LOCAL[runner]
    except KeyError:
        pass
    except TypeError:  # not weakly referable: nothing to keep it by
        return RunContext()
    context = _LOCAL[runner] = RunContext()
    return context

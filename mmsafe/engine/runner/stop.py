"""A hook's request to end training before the loop's own end, and the
exit of a run that a stop signal ended, and how a tool ends after an
error."""
import contextlib
import logging
from typing import Any, Callable, Iterator, Optional, Tuple

from mmsafe.engine.rank_channel import DEFAULT_PEER_GRACE, end_process_after
from mmsafe.errors import MMSafeError
from mmsafe.events import log

#: Exit code of a process whose run a stop signal ended after saving its
#: checkpoint (``EX_TEMPFAIL``: "try again later"); a cluster script
#: requeues the job on it. ``PreemptionHook(exit_code=...)`` changes it.
PREEMPTED_EXIT_CODE = 75


class StopTraining(MMSafeError):
    """Raised by a hook (on every rank, at the same iteration) to end
    training now.

    :class:`~mmsafe.engine.runner.SafeRunner` ends the run cleanly when it
    catches one: it logs the reason, calls the ``after_train`` and
    ``after_run`` hooks (reports, final logs) and returns the model. Under
    another runner the exception ends the run with its message.

    Args:
        reason (str): why training stops, for the log.
        checkpoint (str, optional): the checkpoint saved before stopping.
    """

    def __init__(self, reason: str, checkpoint: Optional[str] = None):
        self.reason = reason
        self.checkpoint = checkpoint
        saved = f' (saved {checkpoint})' if checkpoint else ''
        super().__init__(f'[mmsafe] training stopped: {reason}{saved}')


class Preempted(StopTraining):
    """A stop signal ended training; ``checkpoint`` holds the iteration it
    ended at. :class:`~mmsafe.engine.runner.SafeRunner` runs the
    ``after_train``/``after_run`` hooks, then raises
    :class:`TrainingPreempted` with ``exit_code``."""

    def __init__(self, reason: str, checkpoint: Optional[str],
                 exit_code: int = PREEMPTED_EXIT_CODE):
        self.exit_code = int(exit_code)
        super().__init__(reason, checkpoint)


class TrainingPreempted(SystemExit):
    """Ends the process of a run that a stop signal ended, with the exit
    code a cluster script requeues on (``code``); the checkpoint to resume
    from is complete when this is raised."""

    def __init__(self, code: int, checkpoint: Optional[str] = None):
        super().__init__(code)
        self.checkpoint = checkpoint


@contextlib.contextmanager
def ends_soon_after_error(cfg) -> Iterator[None]:
    """For a tool's ``runner.train()``/``runner.test()``: an error leaving
    the block arms
    :func:`~mmsafe.engine.rank_channel.end_process_after` with the config's
    ``mmsafe_peer_grace`` (the error is raised unchanged)."""
    try:
        yield
    except TrainingPreempted:
        raise  # a clean stop (checkpoint saved), not an error
    except BaseException:
        end_process_after(float(cfg.get('mmsafe_peer_grace',
                                        DEFAULT_PEER_GRACE)))
        raise


def end_stopped_training(runner, stop: StopTraining) -> None:
    """A hook's ``stop`` ended ``runner``'s training loop: say so, then run
    the ``after_train`` and ``after_run`` hooks (reports, final logs) that
    the loop's end would have run."""
    saved = f' (saved {stop.checkpoint})' if stop.checkpoint else ''
    log(f'training stopped by a hook: {stop.reason}{saved}; ending the run '
        '(after_train and after_run hooks run).', logging.WARNING)
    runner.call_hook('after_train')
    runner.call_hook('after_run')


def train_until_stopped(runner, train: Callable[[], Any],
                        end: Callable[[], None]
                        ) -> Tuple[Any, Optional[Preempted]]:
    """``train()`` (MMEngine's ``Runner.train``), where a
    :class:`StopTraining` of a hook ends training cleanly
    (:func:`end_stopped_training`); ``end`` runs after training, stopped or
    not (an error passes unchanged).

    Returns:
        tuple: the model, and the :class:`Preempted` that ended training
        when a stop signal did (None otherwise): the caller raises
        :class:`TrainingPreempted` for it outside its crash report, since a
        stop signal is not a failure.
    """
    try:
        model = train()
    except StopTraining as stop:
        end_stopped_training(runner, stop)
        end()
        return runner.model, stop if isinstance(stop, Preempted) else None
    end()
    return model, None

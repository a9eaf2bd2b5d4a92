"""A hook's request to end training before the loop's own end, and the
exit of a run that a stop signal ended, and how a tool ends after an
error."""
import contextlib
import logging
from typing import Any, Callable, Iterator, Optional, Tuple

from mmsafe.engine.rank_channel import DEFAULT_PEER_GRACE, end_process_after
from mmsafe.engine.run_context import run_context
from mmsafe.errors import MMSafeError
from mmsafe.events import log

#: Exit code of a process whose run a stop signal ended after saving its
#: checkpoint (``EX_TEMPFAIL``: "try again later"); a cluster script
#: requeues the job on it. ``PreemptionHook(exit_code=...)`` changes it.
PREEMPTED_EXIT_CODE = 75

#: Message-hub key of the stop a hook asked for through :func:`stop_run`
#: (``reason``, ``iter``, ``checkpoint``), which ``SafetyReportHook``
#: reports; not kept in checkpoints, so a resumed run starts without it,
#: and outside ``mmsafe/``, whose keys are the guards' counters.
STOP_INFO = 'mmsafe_stop'


def stop_run(runner, reason: str, checkpoint: Optional[str] = None,
             in_train_iter: bool = True,
             exit_code: Optional[int] = None) -> None:
    """End training: the one way a hook stops a run. Call it on every rank
    at the same iteration (a decision taken from values every rank shares,
    e.g. after a :class:`~mmsafe.engine.monitor_sync.MonitorSync` sync).

    * ``IterBasedTrainLoop`` (any stop) and ``EpochBasedTrainLoop`` (a stop
      outside a training iteration, e.g. after a validation):
      ``runner.train_loop.stop_training`` is set, the flag these loops read
      before their next iteration or epoch (as MMEngine's
      ``EarlyStoppingHook`` does); the loop ends normally, under any
      runner, and this function logs the reason and returns;
    * otherwise (``EpochBasedTrainLoop`` inside a training iteration, any
      other loop, or a stop with an ``exit_code``): :class:`StopTraining`
      (:class:`Preempted` with an ``exit_code``) is raised. ``SafeRunner``
      ends the run cleanly (``after_train`` and ``after_run`` hooks run);
      under MMEngine's stock ``Runner`` the exception ends the run with its
      message and a non-zero exit code.

    A stop without ``exit_code`` is recorded under :data:`STOP_INFO` in the
    runner's message hub: ``SafetyReportHook`` reports it as ``stopped``
    (reason, iteration, checkpoint).

    Args:
        runner: the runner whose training stops.
        reason (str): why, for the log and the exception.
        checkpoint (str, optional): the checkpoint saved before stopping.
        in_train_iter (bool): called from a training iteration's hook
            (``after_train_iter``); False after a validation.
        exit_code (int, optional): the process's exit code once the run
            has ended (a stop signal's, :data:`PREEMPTED_EXIT_CODE`); the
            stop is then always raised.

    Raises:
        StopTraining: see above.
    """
    from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
    if exit_code is not None:
        raise Preempted(reason, checkpoint, exit_code)
    iteration = runner.iter + 1 if in_train_iter else runner.iter
    runner.message_hub.update_info(
        STOP_INFO, dict(reason=reason, iter=iteration, checkpoint=checkpoint),
        resumed=False)
    loop = runner.train_loop
    if isinstance(loop, IterBasedTrainLoop) or (
            not in_train_iter and isinstance(loop, EpochBasedTrainLoop)):
        loop.stop_training = True
        saved = f' (saved {checkpoint})' if checkpoint else ''
        log(f'training stops after iteration {iteration}: {reason}{saved}',
            logging.WARNING)
        return
    raise StopTraining(reason, checkpoint=checkpoint)


class StopTraining(MMSafeError):
    """Raised by :func:`stop_run` (on every rank, at the same iteration) to
    end training now.

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
def ends_soon_after_error(runner) -> Iterator[None]:
    """For a tool's ``runner.train()``/``runner.test()``: an error leaving
    the block arms
    :func:`~mmsafe.engine.rank_channel.end_process_after` for the run's
    rank channel with the config's ``mmsafe_peer_grace`` (the error is
    raised unchanged; nothing is armed without a channel)."""
    try:
        yield
    except TrainingPreempted:
        raise  # a clean stop (checkpoint saved), not an error
    except BaseException:
        end_process_after(run_context(runner).rank_channel,
                          float(runner.cfg.get('mmsafe_peer_grace',
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

"""A stop signal ends the run with a checkpoint of the iteration it stopped
at, on every rank the same one."""
import logging
import os
import signal
import threading
import time
from typing import List, Optional, Sequence, Tuple

from mmsafe.registry import HOOKS
from mmengine.hooks import Hook

from mmsafe.checkpoint import atomic_write
from mmsafe.dist import all_gather_object, get_rank, is_distributed
from mmsafe.engine.monitor_sync import logger_interval, monitor_sync_of
from mmsafe.engine.resume_state import STATE_KEY, rank_buffers, run_fingerprint
from mmsafe.engine.run_context import run_context
from mmsafe.engine.runner.stop import PREEMPTED_EXIT_CODE, stop_run
from mmsafe.engine.utils import train_progress
from mmsafe.errors import MMSafeRuntimeError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import log, update_counters, write_event
from mmsafe.rng import RNGState

#: Signals that stop a run by default (those the platform has): Slurm's
#: preemption and time limit (SIGTERM, or the signal asked for with
#: ``--signal``), Ctrl+C, and Ctrl+Break on Windows.
DEFAULT_SIGNALS = ('SIGTERM', 'SIGINT', 'SIGUSR1', 'SIGBREAK')

#: A launcher script sets this to a file; rank 0 writes the exit code into
#: it once the stop checkpoint is complete (torchrun itself exits 1 when it
#: is signalled, whatever its workers did).
EXIT_CODE_FILE_ENV = 'MMSAFE_EXIT_CODE_FILE'

REQUEST = 'preemption/request'

# Handlers to put back in a process forked while a PreemptionHook's are
# installed: a forked child (a metric's multiprocessing pool, ...) must end
# on its parent's terminate() as it would without mmsafe.
_FORK_RESETS: dict = {}


def _reset_in_child() -> None:
    for sig, previous in list(_FORK_RESETS.items()):
        try:
            signal.signal(sig, previous)
        except (ValueError, TypeError, OSError):
            pass
    _FORK_RESETS.clear()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_reset_in_child)


def signals_by_name(names: Sequence[str]) -> List[signal.Signals]:
    """The platform's signals among ``names`` (unknown names skipped)."""
    found = []
    for name in names:
        sig = getattr(signal, str(name).upper(), None)
        if isinstance(sig, signal.Signals) and sig not in found:
            found.append(sig)
    return found


@HOOKS.register_module()
class PreemptionHook(Hook):
    """End training cleanly on a stop signal: a checkpoint of one iteration,
    the same on every rank, then exit with ``exit_code``.

    * A signal only sets a flag; the iteration under way finishes.
    * **One stop iteration for all ranks**, without communication on a
      healthy step: under DDP each rank that received a signal posts a
      request to the runner's
      :class:`~mmsafe.engine.monitor_sync.MonitorSync`, whose one
      all-reduce per log interval carries it; every rank sees the sum at the
      same iteration and stops there (at the end of a gradient-accumulation
      window). In a single process the run stops after the iteration the
      signal arrived in. A stop therefore takes at most one log interval
      (``LoggerHook.interval`` iterations) plus the save.
    * **The checkpoint** ``{work_dir}/preempted_iter_{N}.pth`` is MMEngine's
      (model, optimizer with its AMP loss scaler, schedulers, message hub
      with mmsafe's counters), written atomically, plus each rank's random
      generators and position in the epoch and a fingerprint of the run
      (:mod:`mmsafe.engine.resume_state`); ``last_checkpoint`` names it, so
      ``--resume`` continues from it, exactly (:mod:`mmsafe.engine.loops`).
      Every rank waits until rank 0 has written it.
    * **Further signals** while stopping or saving are logged and ignored:
      the atomic write leaves the previous checkpoint intact even if the
      process is killed meanwhile.
    * The log, ``mmsafe_events.jsonl`` (``preempted``) and
      ``safety_report.json`` (``status: preempted``) name the iteration,
      the checkpoint and the signal; then the ``after_train``/``after_run``
      hooks run and the process exits with ``exit_code``
      (:class:`~mmsafe.engine.runner.TrainingPreempted`). With
      ``MMSAFE_EXIT_CODE_FILE`` set (``tools/dist_train.sh``,
      ``tools/slurm_train.sh``), rank 0 also writes the code there.
    * A SIGTERM after another rank failed is the launcher ending a failed
      run, not a preemption: the process ends as it would without this hook.

    DataLoader worker processes ignore these signals while
    :class:`~mmsafe.engine.runner.SafeRunner` trains (a cluster signals
    every process of a job); the training process stops them.

    Args:
        signals (Sequence[str]): signal names that stop the run; names the
            platform lacks are skipped.
        exit_code (int): the process's exit code after the checkpoint is
            saved (default 75, ``EX_TEMPFAIL``).
    """

    guard_outputs = GuardOutputs(
        Section.PREEMPTION,
        events=(Event.PREEMPTED, ),
        counters=(CounterKey.PREEMPTION, ))

    priority = 'LOWEST'  # after every other hook of the iteration

    def __init__(self, signals: Sequence[str] = DEFAULT_SIGNALS,
                 exit_code: int = PREEMPTED_EXIT_CODE) -> None:
        self.signals = signals_by_name(signals)
        self.exit_code = int(exit_code)
        self._previous: dict = {}
        self._received: List[Tuple[str, float, Optional[int]]] = []
        self._announced = 0
        self._posted = False
        self._decided_at: Optional[int] = None
        self._runner = None
        self._sync = None

    # -------------------------------------------------------- signals --
    def before_run(self, runner) -> None:
        self._runner = runner
        self._sync = monitor_sync_of(runner)
        self._sync.declare(REQUEST)
        if threading.current_thread() is not threading.main_thread():
            log('PreemptionHook: the run is not in the main thread, where '
                'Python delivers signals; stop signals end it as they '
                'would without mmsafe.', logging.WARNING)
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
            _FORK_RESETS.setdefault(sig, self._previous[sig])

    def _restore_handlers(self) -> None:
        for sig, previous in self._previous.items():
            _FORK_RESETS.pop(sig, None)
            try:
                signal.signal(sig, previous)
            except (ValueError, TypeError, OSError):
                pass
        self._previous = {}

    def _on_signal(self, signum: int, frame) -> None:
        # (A process forked from this one gets the previous handlers back:
        # _reset_in_child.)
        previous = self._previous.get(signal.Signals(signum))
        runner = self._runner
        channel = run_context(runner).rank_channel
        if channel is not None and channel.peer_failures:
            # The launcher tears down a run whose other rank failed.
            self._restore_handlers()
            _as_before(signum, frame, previous)
            return
        _, done, _ = train_progress(runner)
        self._received.append((signal.Signals(signum).name, time.time(),
                               done))

    def after_train(self, runner) -> None:
        self._restore_handlers()

    def after_run(self, runner) -> None:
        self._restore_handlers()

    # ------------------------------------------------------ agreement --
    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        if not self._received:
            return
        self._announce(runner)
        self._post_request()

    def _post_request(self) -> None:
        """Under DDP, once: this rank's stop request, for the next
        monitoring sync."""
        if self._received and not self._posted and is_distributed():
            self._sync.post(REQUEST, 1.0)
            self._posted = True

    def _announce(self, runner) -> None:
        if self._announced >= len(self._received):
            return
        if self._announced == 0:
            name, _, it = self._received[0]
            at = '' if it is None else f' in iteration {it + 1}'
            if is_distributed():
                how = ('all ranks stop together at the next monitoring sync '
                       f'(every {logger_interval(runner)} iterations) and '
                       'save a checkpoint')
            else:
                how = 'stopping after this iteration with a checkpoint'
            log(f'{name} received{at} on rank {get_rank()}: {how}; '
                f'then the process exits with code {self.exit_code}.',
                logging.WARNING)
        else:
            more = [name for name, _, _ in
                    self._received[self._announced:]]
            log(f'{", ".join(more)} received again on rank {get_rank()} '
                'while stopping: ignored (the checkpoint is written '
                'atomically; the stop goes on; SIGKILL ends the process at '
                'once).', logging.WARNING)
        self._announced = len(self._received)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if is_distributed():
            self._post_request()
            if (self._sync.sync(runner) and self._decided_at is None
                    and self._sync.last(REQUEST) > 0):
                self._decided_at = runner.iter + 1
        elif self._received and self._decided_at is None:
            self._decided_at = runner.iter + 1
        if self._decided_at is None or not _optimizer_stepped(runner):
            return
        if self.is_last_train_iter(runner):
            return  # the run ends with this iteration anyway
        self._stop(runner, batch_idx)

    # ----------------------------------------------------------- stop --
    def _stop(self, runner, batch_idx: int) -> None:
        from mmengine.dist import barrier
        from mmengine.runner import IterBasedTrainLoop
        self._announce(runner)
        started = time.time()
        loop = runner.train_loop
        done = runner.iter + 1
        by_epoch = not isinstance(loop, IterBasedTrainLoop)
        mine = dict(rank=get_rank(), iter=done, epoch=runner.epoch,
                    batches_in_epoch=batch_idx + 1 if by_epoch else done,
                    signals=[name for name, _, _ in self._received],
                    rng=RNGState().state_dict(),
                    # rank 0's are the checkpoint's state_dict
                    buffers=rank_buffers(runner.model) if get_rank() else {})
        states = all_gather_object(mine)
        if {s['iter'] for s in states} != {done}:
            raise MMSafeRuntimeError(
                '[mmsafe] PreemptionHook: ranks stopped at different '
                'iterations: ' + ', '.join(
                    f"rank {s['rank']}: {s['iter']}" for s in states))
        filename = f'preempted_iter_{done}.pth'
        path = os.path.join(runner.work_dir, filename)
        signals = sorted({n for s in states for n in s['signals']})
        received = [s['rank'] for s in states if s['signals']]
        meta = dict(epoch=runner.epoch, iter=done, **{
            STATE_KEY: dict(ranks=states, fingerprint=run_fingerprint(runner),
                            signals=signals, ranks_signalled=received)})
        runner.save_checkpoint(runner.work_dir, filename, meta=meta,
                               by_epoch=by_epoch)
        if get_rank() == 0:
            atomic_write(os.path.join(runner.work_dir, 'last_checkpoint'),
                         lambda f: f.write(path), mode='w')
            _remove_older_stop_checkpoints(runner.work_dir, path)
            code_file = os.environ.get(EXIT_CODE_FILE_ENV)
            if code_file:
                atomic_write(code_file,
                             lambda f: f.write(f'{self.exit_code}\n'),
                             mode='w')
        if is_distributed():
            barrier()  # nobody exits before the checkpoint is complete
        seconds = round(time.time() - started, 3)
        waited = round(started - self._received[0][1], 3) \
            if self._received else None
        where = (f'epoch {runner.epoch + 1}, batch {batch_idx + 1}, '
                 if by_epoch else '')
        reason = (f'{"/".join(signals) or "a stop signal"} (received by '
                  f'rank(s) {", ".join(map(str, received)) or "?"}): '
                  f'preempted at {where}iteration {done}')
        details = dict(iter=done, epoch=runner.epoch,
                       batches_in_epoch=mine['batches_in_epoch'],
                       checkpoint=path, signals=signals,
                       ranks_signalled=received, save_s=seconds,
                       signal_to_save_s=waited, exit_code=self.exit_code)
        update_counters(CounterKey.PREEMPTION, **details)
        if get_rank() == 0:
            write_event(runner.work_dir, Event.PREEMPTED, **details)
        self._announce(runner)
        log(f'{reason}; checkpoint {path} saved in {seconds:g} s '
            f'({waited if waited is not None else "?"} s after the signal). '
            f'The process exits with code {self.exit_code}; continue with '
            '`--resume`.', logging.WARNING)
        stop_run(runner, reason, path, exit_code=self.exit_code)


def _remove_older_stop_checkpoints(folder: str, keep: str) -> None:
    """Earlier ``preempted_iter_*.pth`` of the folder: the new one is
    complete and named by ``last_checkpoint``, so they are superseded."""
    import glob
    for path in glob.glob(os.path.join(folder, 'preempted_iter_*.pth')):
        if os.path.abspath(path) != os.path.abspath(keep):
            try:
                os.remove(path)
            except OSError as err:
                log(f'could not remove the earlier stop checkpoint {path}: '
                    f'{err}', logging.WARNING)


def _as_before(signum: int, frame, previous) -> None:
    """Handle ``signum`` as the handler before mmsafe's would have."""
    if previous is signal.SIG_IGN:
        return
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _optimizer_stepped(runner) -> bool:
    """Whether this iteration ended a gradient-accumulation window (the
    gradients are in the weights, nothing is left in ``.grad``)."""
    should_update = getattr(runner.optim_wrapper, 'should_update', None)
    return True if should_update is None else bool(should_update())

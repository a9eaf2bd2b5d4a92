"""Turn a frozen run into stack traces that say where each rank is stuck.

:class:`HangWatchdogHook` keeps a :class:`Heartbeat`: what the main thread
of a rank did last and the phase it is in, marked by the hook's own
methods and by :class:`PhaseMarks` (PyTorch forward and optimizer-step
hooks). A :class:`WatchdogThread` polls it; when the main thread stalls,
:class:`HangReporter` writes the stacks of the rank's threads (a file, the
log, an event, counters) and, when asked to, ends the process.
"""
import faulthandler
import logging
import os
import os.path as osp
import socket
import sys
import threading
import time
import traceback
from types import FrameType
from typing import Any, Callable, Dict, List, Optional

import torch.nn as nn
from mmengine.hooks import Hook

from mmsafe.registry import HOOKS
from mmsafe.dist import get_rank, get_world_size
from mmsafe.engine.utils import unwrap_model
from mmsafe.errors import MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import log, update_counters, write_event

# The phases of a rank's main thread, as a hang report names them.
SETUP = 'setup (loading checkpoints, building the loop)'
DATA = 'data'
PREPROCESS = 'data preprocessing'
FORWARD = 'forward'
BACKWARD = 'backward'
BACKWARD_DDP = 'backward (DDP gradient all-reduce: a collective)'
STEP = 'optimizer step'
AFTER_STEP = 'hooks (after_train_iter)'
EPOCH_END = 'epoch end (validation or next epoch)'
CHECKPOINT = 'saving a checkpoint'

#: Phases of an evaluation start with its stage name ('validation', 'test').
EVAL_STAGES = ('validation', 'test')

#: Exit code of an aborted rank (EX_TEMPFAIL: "try again later").
ABORT_EXIT_CODE = 75


def eval_phase(stage: str, what: str) -> str:
    """Phase name of an evaluation, e.g. ``'validation (forward)'``."""
    return f'{stage} ({what})'


class Heartbeat:
    """Progress marks of the main thread.

    Invariant: only the main thread writes (hook methods and the PyTorch
    hooks that :class:`~mmsafe.engine.hooks.HangWatchdogHook` registers run
    there), and each field is a single attribute store, so the watchdog
    thread reads a consistent-enough snapshot without a lock: ``seq``
    changes on every mark, ``phase`` names what started at the last mark.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.time = time.monotonic()
        self.phase = SETUP
        self.first = True  # the first iteration of an epoch is running
        self.batch_idx: Optional[int] = None

    def beat(self, phase: Optional[str] = None) -> None:
        """Record progress, and the phase that starts now when given."""
        if phase is not None:
            self.phase = phase
        self.time = time.monotonic()
        self.seq += 1


# Stacks of the threads of this process, read from another thread; the
# module of torch.distributed's public collectives:
_C10D = osp.join('torch', 'distributed', 'distributed_c10d.py')


def all_stacks() -> str:
    """Every thread's stack except the caller's, main thread first."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    parts = []
    for ident in sorted(frames, key=lambda ident: ident != main):
        if ident == me:
            continue
        stack = ''.join(traceback.format_stack(frames[ident]))
        parts.append(f'--- thread {names.get(ident, "?")} '
                     f'(id {ident}) ---\n{stack}')
    return '\n'.join(parts)


def main_frame() -> Optional[FrameType]:
    """The innermost Python frame of the main thread."""
    return sys._current_frames().get(threading.main_thread().ident)


def describe(frame: Optional[FrameType]) -> str:
    """``function (file:line)`` of a frame."""
    if frame is None:
        return '?'
    code = frame.f_code
    return f'{code.co_name} ({code.co_filename}:{frame.f_lineno})'


def collective_of(frame: Optional[FrameType]) -> Optional[str]:
    """Name of the ``torch.distributed`` collective that ``frame``'s thread
    is inside (the outermost one: the function its caller called, e.g.
    ``all_gather_object`` rather than the ``all_gather`` inside it), or
    None. A collective waiting in native code (DDP's gradient all-reduce
    during backward) has no Python frame and is not seen here."""
    name = None
    while frame is not None:
        if frame.f_code.co_filename.endswith(_C10D):
            name = frame.f_code.co_name
        frame = frame.f_back
    return name


class WatchdogThread:
    """Poll a heartbeat from a daemon thread.

    Every ``poll_interval`` seconds it compares the heartbeat's ``seq`` with
    the previous poll. Once the main thread made no progress for longer
    than ``allowance(phase, first)`` seconds, ``on_stall(phase, idle,
    allowance)`` is called once; ``abort_after`` more seconds without
    progress call ``on_abort(phase, idle)`` (which is expected to end the
    process); a mark after a stall calls ``on_resume(phase, stalled_s)``.

    Invariant: the callbacks run in this thread and only read the
    heartbeat; nothing here blocks the main thread.

    Args:
        heartbeat (Heartbeat): what the main thread marks.
        allowance (Callable): ``(phase, first) -> seconds`` allowed.
        on_stall, on_abort, on_resume (Callable): see above.
        poll_interval (float): seconds between polls.
        abort_after (float, optional): seconds after the allowance before
            ``on_abort``; None never aborts.
        native_backstop (bool): keep ``faulthandler.dump_traceback_later``
            armed a little past the allowance. It fires (stacks to stderr)
            only when this thread cannot run because the main thread holds
            the interpreter lock in native code.
    """

    def __init__(self, heartbeat: Heartbeat,
                 allowance: Callable[[str, bool], float],
                 on_stall: Callable[[str, float, float], None],
                 on_abort: Callable[[str, float], None],
                 on_resume: Callable[[str, float], None],
                 poll_interval: float,
                 abort_after: Optional[float] = None,
                 native_backstop: bool = True) -> None:
        self.heartbeat = heartbeat
        self.allowance = allowance
        self.on_stall = on_stall
        self.on_abort = on_abort
        self.on_resume = on_resume
        self.poll_interval = poll_interval
        self.abort_after = abort_after
        self.native_backstop = native_backstop
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, name='mmsafe-hang-watchdog', daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and disarm the native backstop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_interval * 2 + 1)
            self._thread = None
        if self.native_backstop:
            faulthandler.cancel_dump_traceback_later()

    def _arm_backstop(self, allowance: float) -> None:
        try:
            faulthandler.dump_traceback_later(
                allowance + 10 * self.poll_interval + 30, exit=False)
        except (RuntimeError, ValueError, OSError):
            self.native_backstop = False  # no usable stderr

    def _watch(self) -> None:
        stalled_seq = None
        stalled_at = 0.
        while True:
            stopping = self._stop.wait(self.poll_interval)
            hb = self.heartbeat
            seq, last, phase, first = hb.seq, hb.time, hb.phase, hb.first
            if stalled_seq is not None and seq != stalled_seq:
                self.on_resume(phase, last - stalled_at)
                stalled_seq = None
            if stopping:
                return
            allowance = self.allowance(phase, first)
            idle = time.monotonic() - last
            if self.native_backstop:
                self._arm_backstop(allowance)
            if idle <= allowance:
                continue
            if stalled_seq is None:
                stalled_seq, stalled_at = seq, last
                self.on_stall(phase, idle, allowance)
            elif self.abort_after is not None and \
                    idle > allowance + self.abort_after:
                self.on_abort(phase, idle)


class PhaseMarks:
    """Mark ``heartbeat`` from hooks registered on a model and optimizers.

    Invariants: only the main thread marks (a forward in another thread is
    not this rank's training step); only the first forward after
    :meth:`new_iteration` changes the phase (a hook's extra forward only
    marks progress); :meth:`detach` removes every handle it registered.

    Args:
        heartbeat (Heartbeat): what to mark.
    """

    def __init__(self, heartbeat: Heartbeat) -> None:
        self.heartbeat = heartbeat
        self.stage = 'train'  # or 'validation', 'test'
        self.ddp = False
        self._forwarded = False
        self._handles: List = []

    def phase(self, what: str) -> str:
        """The phase ``what`` of an evaluation (``'validation (forward)'``)
        or ``what`` itself in training."""
        return what if self.stage == 'train' else eval_phase(
            self.stage, what)

    def new_iteration(self) -> None:
        self._forwarded = False

    # ------------------------------------------------------------------ #
    def attach(self, model: nn.Module, optim_wrapper, ddp: bool) -> None:
        """Register on ``model`` (unwrapped), its ``data_preprocessor`` and
        the optimizer(s) of ``optim_wrapper`` (an ``OptimWrapper`` or
        ``OptimWrapperDict``; anything else, e.g. the config of a run that
        does not train, is skipped)."""
        from mmengine.optim import OptimWrapper, OptimWrapperDict
        self.ddp = ddp
        preprocessor = getattr(model, 'data_preprocessor', None)
        if isinstance(preprocessor, nn.Module):
            self._handles.append(
                preprocessor.register_forward_pre_hook(self._preprocess))
        self._handles.append(model.register_forward_pre_hook(self._forward))
        self._handles.append(model.register_forward_hook(self._forwarded_))
        wrappers = list(optim_wrapper.optim_wrappers.values()) if isinstance(
            optim_wrapper, OptimWrapperDict) else [optim_wrapper]
        for wrapper in wrappers:
            if isinstance(wrapper, OptimWrapper):
                optimizer = wrapper.optimizer
                self._handles.append(
                    optimizer.register_step_pre_hook(self._step))
                self._handles.append(
                    optimizer.register_step_post_hook(self._stepped))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # ------------------------------------------------------------------ #
    @staticmethod
    def _main() -> bool:
        return threading.current_thread() is threading.main_thread()

    def _preprocess(self, module, args) -> None:
        if self._main():
            self.heartbeat.beat(
                None if self._forwarded else self.phase(PREPROCESS))

    def _forward(self, module, args) -> None:
        if self._main():
            self.heartbeat.beat(
                None if self._forwarded else self.phase(FORWARD))

    def _forwarded_(self, module, args, output) -> None:
        if not self._main():
            return
        if self._forwarded:
            self.heartbeat.beat()
            return
        self._forwarded = True
        if self.stage == 'train':
            self.heartbeat.beat(BACKWARD_DDP if self.ddp else BACKWARD)
        else:
            event = 'val' if self.stage == 'validation' else self.stage
            self.heartbeat.beat(self.phase(
                f'metric processing, after_{event}_iter hooks'))

    def _step(self, optimizer, args, kwargs) -> None:
        if self._main():
            self.heartbeat.beat(STEP)

    def _stepped(self, optimizer, args, kwargs) -> None:
        if self._main():
            self.heartbeat.beat(AFTER_STEP)


class HangReporter:
    """Write what a stalled rank is doing.

    Args:
        runner: the runner (``work_dir``, ``iter``, ``epoch``, ``logger``).
        rank (int): this process's rank.
        world_size (int): number of ranks.
    """

    def __init__(self, runner, rank: int, world_size: int) -> None:
        self.runner = runner
        self.rank = rank
        self.world_size = world_size
        self.stalls = 0

    def where(self, batch_idx) -> Dict[str, Any]:
        where = dict(rank=self.rank, world_size=self.world_size)
        for key in ('iter', 'epoch'):
            try:
                where[key] = getattr(self.runner, key)
            except Exception:  # noqa: BLE001  (loop not built yet)
                where[key] = None
        where['batch_idx'] = batch_idx
        return where

    def report(self, phase: str, idle: float, allowance: float,
               batch_idx) -> str:
        """Write ``{work_dir}/hang_rank{R}.txt``, log it and record a
        ``hang`` event; returns the report text."""
        self.stalls += 1
        where = self.where(batch_idx)
        frame = main_frame()
        main_at = describe(frame)
        collective = collective_of(frame)
        del frame
        header = (
            f'mmsafe hang report: rank {self.rank} of {self.world_size} '
            f'(pid {os.getpid()}, {socket.gethostname()}) made no progress '
            f'for {idle:.1f} s (allowed {allowance:g} s) at iteration '
            f'{where["iter"]} (epoch {where["epoch"]}, batch '
            f'{where["batch_idx"]}), phase {phase!r}.\n'
            f'main thread is in {main_at}')
        if collective is not None:
            header += (f'\nThis rank waits in a collective '
                       f'(torch.distributed.{collective}): another rank has '
                       'probably stalled or died. Compare the hang_rank*.txt '
                       'reports of all ranks.')
        elif 'collective' in phase:
            header += ('\nThis phase includes a collective. If this rank '
                       'waits in a collective, another rank has probably '
                       'stalled or died: compare the hang_rank*.txt reports '
                       'of all ranks.')
        elif phase == DATA:
            header += ('\nThis rank waits for its DataLoader (or in another '
                       "hook's before_train_iter): a worker may be stuck; "
                       'num_workers=0 in the loader config rules worker '
                       'deadlocks out (see DataLoaderProbeHook).')
        report = f'{header}\n\n{all_stacks()}\n'
        work_dir = getattr(self.runner, 'work_dir', None)
        path = None
        if work_dir:
            path = osp.join(work_dir, f'hang_rank{self.rank}.txt')
            with open(path, 'a', encoding='utf-8') as f:
                f.write(f'===== {time.strftime("%Y-%m-%d %H:%M:%S")} '
                        f'=====\n{report}\n')
        log(f'{report}(written to {path})', logging.ERROR)
        write_event(work_dir, Event.HANG, phase=phase, idle_s=round(idle, 1),
                    allowance_s=allowance, main_thread=main_at,
                    collective=collective, file=path, **where)
        update_counters(CounterKey.HANG_WATCHDOG, stalls=self.stalls,
                        last_phase=phase, last_iter=where['iter'])
        return report

    def resumed(self, phase: str, stalled_s: float) -> None:
        log(f'rank {self.rank} makes progress again after {stalled_s:.1f} s '
            f'(phase now {phase!r}).', logging.WARNING)

    def abort(self, phase: str, idle: float, batch_idx,
              exit_code: int) -> None:
        """Log, record a ``hang_abort`` event, flush, and end the process
        with ``exit_code`` (no cleanup: the main thread is stuck)."""
        where = self.where(batch_idx)
        log(f'HangWatchdogHook: aborting rank {self.rank}: no progress for '
            f'{idle:.1f} s at iteration {where["iter"]}, phase {phase!r}. '
            f'Exiting with code {exit_code} so that the launcher or '
            'scheduler can restart the job (resume with --resume). Set '
            'abort_timeout=None to wait instead.', logging.ERROR)
        write_event(getattr(self.runner, 'work_dir', None), Event.HANG_ABORT,
                    phase=phase, idle_s=round(idle, 1), exit_code=exit_code,
                    **where)
        handlers = logging.getLogger().handlers + list(
            getattr(getattr(self.runner, 'logger', None), 'handlers', []))
        for handler in handlers:
            try:
                handler.flush()
            except (OSError, ValueError) as err:  # closed stream
                print(f'[mmsafe] could not flush {handler}: {err}',
                      file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)


@HOOKS.register_module()
class HangWatchdogHook(Hook):
    """Write the stacks of a rank that stops making progress.

    Every rank keeps a heartbeat with its phase. The phase is marked from
    this hook's methods and from PyTorch's extension points, registered in
    ``before_run`` and removed in ``after_run``:

    * forward pre/post hooks on the data preprocessor and the (unwrapped)
      model: ``data preprocessing``, ``forward``, then ``backward`` (with
      DDP ``backward (DDP gradient all-reduce: a collective)``), marked by
      the first forward of each iteration;
    * step pre/post hooks on the optimizer(s) of the optim wrapper:
      ``optimizer step``, then ``hooks (after_train_iter)``;
    * this hook's methods (it runs last in every event): ``data`` after an
      iteration (loading the next batch and the other hooks'
      ``before_train_iter``), ``validation (...)``/``test (...)``,
      ``saving a checkpoint``, ``epoch end``, ``setup``.

    A step that the optim wrapper skips marks no ``optimizer step``; its
    phase stays ``backward`` until the iteration ends.

    A watchdog thread checks the heartbeat; when no progress was made for
    ``timeout`` seconds (``first_iter_timeout`` until the first iteration of
    an epoch ends, ``val_timeout`` during validation and test) it writes the
    stacks of all threads to ``{work_dir}/hang_rank{R}.txt`` and to the log,
    naming the rank, iteration, phase and, when the main thread is inside a
    ``torch.distributed`` collective, that collective. A rank that waits in
    a collective is usually the victim: look for the rank whose report shows
    another phase. When progress resumes, that is logged too.

    With ``abort_timeout`` the process exits with code ``abort_exit_code``
    when ``abort_timeout`` more seconds pass without progress, so that
    ``torchrun --max-restarts`` or a scheduler can restart the job (resume
    with ``--resume``).

    If the main thread holds Python's global lock in native code, the
    watchdog thread cannot run; as a backstop, ``faulthandler`` then dumps
    the stacks to stderr.

    Args:
        timeout (float): seconds without progress before a report.
            Defaults to 300.
        first_iter_timeout (float): the same for the first iteration of
            each epoch (worker start-up, checkpoint loading, compilation).
            Defaults to 900.
        val_timeout (float): the same during validation and test
            (evaluation can take long). Defaults to 900.
        abort_timeout (float, optional): seconds after a report before the
            process exits. Defaults to None (never abort).
        abort_exit_code (int): exit code of an abort. Defaults to 75.
        poll_interval (float, optional): how often the watchdog looks;
            defaults to a tenth of the shortest deadline, at most 5 s.
        native_backstop (bool): arm ``faulthandler`` as described above.
            Defaults to True.
    """

    guard_outputs = GuardOutputs(
        Section.WATCHDOG_EVENTS,
        events=(Event.HANG, Event.HANG_ABORT),
        counters=(CounterKey.HANG_WATCHDOG, ))

    priority = 'LOWEST'  # runs last: its marks name what comes next

    def __init__(self,
                 timeout: float = 300.,
                 first_iter_timeout: float = 900.,
                 val_timeout: float = 900.,
                 abort_timeout: Optional[float] = None,
                 abort_exit_code: int = ABORT_EXIT_CODE,
                 poll_interval: Optional[float] = None,
                 native_backstop: bool = True) -> None:
        for name, value in (('timeout', timeout),
                            ('first_iter_timeout', first_iter_timeout),
                            ('val_timeout', val_timeout)):
            if value <= 0:
                raise MMSafeValueError(f'HangWatchdogHook: {name} must be > 0')
        self.timeout = float(timeout)
        self.first_iter_timeout = float(first_iter_timeout)
        self.val_timeout = float(val_timeout)
        self.abort_timeout = abort_timeout
        self.abort_exit_code = abort_exit_code
        shortest = min(self.timeout, self.first_iter_timeout,
                       self.val_timeout)
        self.poll_interval = poll_interval or min(5., max(.2, shortest / 10))
        self.native_backstop = native_backstop
        self._hb = Heartbeat()
        self._thread: Optional[WatchdogThread] = None
        self._reporter: Optional[HangReporter] = None
        self._marks = PhaseMarks(self._hb)
        self._training = False

    # ------------------------------------------------------- the marks --
    def _mark(self, phase: Optional[str] = None) -> None:
        self._hb.beat(phase)

    def _eval_phase(self, what: str) -> str:
        return self._marks.phase(what)

    def _allowance(self, phase: str, first: bool) -> float:
        if phase.startswith(EVAL_STAGES):
            return self.val_timeout
        return self.first_iter_timeout if first else self.timeout

    # ------------------------------------------------------ run events --
    def before_run(self, runner) -> None:
        world_size = get_world_size()
        model = unwrap_model(runner.model)
        # runner.optim_wrapper is built before before_run by Runner.train.
        self._marks.attach(model, runner.optim_wrapper,
                           ddp=world_size > 1 and model is not runner.model)
        reporter = HangReporter(runner, get_rank(), world_size)
        self._reporter = reporter
        self._mark(SETUP)
        self._thread = WatchdogThread(
            self._hb, self._allowance,
            on_stall=lambda phase, idle, allowance: reporter.report(
                phase, idle, allowance, self._hb.batch_idx),
            on_abort=lambda phase, idle: reporter.abort(
                phase, idle, self._hb.batch_idx, self.abort_exit_code),
            on_resume=reporter.resumed,
            poll_interval=self.poll_interval,
            abort_after=self.abort_timeout,
            native_backstop=self.native_backstop)
        self._thread.start()

    def after_run(self, runner) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        self._marks.detach()

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self._mark(CHECKPOINT)

    # ------------------------------------------------------- training --
    def before_train(self, runner) -> None:
        self._training = True
        self._marks.stage = 'train'
        self._hb.first = True
        self._mark(DATA)

    def after_train(self, runner) -> None:
        self._training = False
        self._mark()

    # -------------------------------------------------- evaluation --
    def _begin_eval(self, stage: str) -> None:
        self._marks.stage = stage
        self._mark(self._eval_phase('data'))

    def _end_eval(self) -> None:
        if self._training:
            self._marks.stage = 'train'
            self._mark(DATA)
        else:
            self._mark(self._eval_phase('end'))

    def before_val(self, runner) -> None:
        self._begin_eval('validation')

    def after_val(self, runner) -> None:
        self._end_eval()

    def before_test(self, runner) -> None:
        self._begin_eval('test')

    def after_test(self, runner) -> None:
        self._end_eval()

    # ------------------------------- epochs and iterations, every mode --
    # MMEngine's Hook sends before/after_{train,val,test}_{epoch,iter}
    # here with ``mode``; validation and test are marked alike, with the
    # stage that before_val/before_test set.
    def _before_epoch(self, runner, mode: str = 'train') -> None:
        if mode == 'train':
            self._hb.first = True
            self._mark(DATA)
        else:
            self._mark(self._eval_phase('data'))

    def _after_epoch(self, runner, mode: str = 'train') -> None:
        self._mark(EPOCH_END if mode == 'train' else
                   self._eval_phase('end'))

    def _before_iter(self, runner, batch_idx: int, data_batch=None,
                     mode: str = 'train') -> None:
        self._hb.batch_idx = batch_idx
        self._marks.new_iteration()
        self._mark(PREPROCESS if mode == 'train' else
                   self._eval_phase('data preprocessing'))

    def _after_iter(self, runner, batch_idx: int, data_batch=None,
                    outputs=None, mode: str = 'train') -> None:
        if mode == 'train':
            self._hb.first = False
            self._mark(DATA)
        else:
            self._mark(self._eval_phase('data / evaluation'))

"""Turn a frozen run into stack traces that say where each rank is stuck.

A run that froze at batch 50 under DDP printed nothing: one rank had
stopped, the others waited for it in a gradient all-reduce, and the only
way to find out was to attach a debugger to every process. With this hook
every rank keeps a heartbeat with its current phase; a watchdog thread that
sees no progress for too long writes the stacks of all threads to
``{work_dir}/hang_rank{R}.txt`` and to the log, and can abort the process so
that a scheduler restarts the job.

Importing this module also gives distributed runs a finite timeout by
default (see :func:`install_default_dist_timeout`).
"""
import faulthandler
import functools
import logging
import os
import os.path as osp
import socket
import sys
import threading
import time
import traceback
from typing import Any, Dict, Optional

import torch
from mmengine.hooks import Hook

from mmdet.registry import HOOKS
from mmsafe.events import log, update_counters, write_event

#: Default ``env_cfg.dist_cfg.timeout`` in seconds, applied when a config
#: launches distributed training without one.
DEFAULT_DIST_TIMEOUT = 1800

#: Exit code of an aborted rank (EX_TEMPFAIL: "try again later").
ABORT_EXIT_CODE = 75

# Phase that starts when a runner hook event has finished.
_PHASE_AFTER = {
    'before_run': 'setup (loading checkpoints, building the loop)',
    'before_train': 'data',
    'before_train_epoch': 'data',
    'before_train_iter': 'forward',
    'after_train_iter': 'data',
    'after_train_epoch': 'epoch end (validation or next epoch)',
    'before_val': 'validation (data)',
    'before_val_epoch': 'validation (data)',
    'before_val_iter': 'validation (forward)',
    'after_val_iter': 'validation (data / evaluation)',
    'after_val_epoch': 'validation (end)',
    'after_val': 'data',
    'before_test': 'test (data)',
    'before_test_epoch': 'test (data)',
    'before_test_iter': 'test (forward)',
    'after_test_iter': 'test (data / evaluation)',
    'before_save_checkpoint': 'saving a checkpoint',
}

_COLLECTIVES = (
    'all_reduce', 'all_gather', 'all_gather_object', 'all_gather_into_tensor',
    'broadcast', 'broadcast_object_list', 'reduce', 'reduce_scatter',
    'reduce_scatter_tensor', 'gather', 'gather_object', 'scatter',
    'scatter_object_list', 'all_to_all', 'all_to_all_single', 'barrier',
    'monitored_barrier')

# The watchdog of this process (one runner trains at a time).
_ACTIVE: Optional['HangWatchdogHook'] = None


def install_default_dist_timeout(seconds: float = DEFAULT_DIST_TIMEOUT
                                 ) -> None:
    """Give distributed runs a finite collective timeout by default.

    MMEngine passes ``env_cfg.dist_cfg`` to ``init_dist`` before any hook
    exists, so a hook cannot set the timeout itself. This wraps
    ``Runner.setup_env`` to add ``timeout=seconds`` when a distributed
    config sets none. A config's own value always wins::

        env_cfg = dict(dist_cfg=dict(backend='nccl', timeout=1800))

    With it a rank that waits for a dead or stalled peer fails with a
    timeout error (and the launcher stops the job) instead of waiting
    forever; keep it longer than the watchdog's deadlines so that the stack
    report comes first.
    """
    from mmengine.runner import Runner
    if getattr(Runner.setup_env, '_mmsafe_dist_timeout', False):
        return
    original = Runner.setup_env

    @functools.wraps(original)
    def setup_env(self, env_cfg: Dict) -> None:
        dist_cfg = dict(env_cfg.get('dist_cfg', None) or {})
        if self.distributed and dist_cfg.get('timeout') is None:
            import torch.distributed as dist
            if not (dist.is_available() and dist.is_initialized()):
                dist_cfg['timeout'] = seconds
                env_cfg = type(env_cfg)(env_cfg)
                env_cfg['dist_cfg'] = dist_cfg
                log(f'distributed timeout: {seconds:g} s (mmsafe default; '
                    'set env_cfg.dist_cfg.timeout to change it).')
        return original(self, env_cfg)

    setup_env._mmsafe_dist_timeout = True
    Runner.setup_env = setup_env


class _Heartbeat:
    """What the main thread did last; plain attributes, written by the
    main thread only, so the watchdog reads them without a lock."""

    def __init__(self):
        self.seq = 0
        self.time = time.monotonic()
        self.phase = 'setup'
        self.first = True
        self.batch_idx: Optional[int] = None


def _collective_wrapper(fn, name: str):

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        wd = _ACTIVE
        if wd is None or threading.current_thread() is not \
                threading.main_thread():
            return fn(*args, **kwargs)
        previous = wd.beat(f'collective ({name})')
        try:
            return fn(*args, **kwargs)
        finally:
            wd.beat(previous)

    wrapper._mmsafe_original = fn
    return wrapper


def _install_collective_markers() -> None:
    """Mark ``torch.distributed`` collectives as a phase; the wrappers
    pass straight through when no watchdog is active."""
    import torch.distributed as dist
    for name in _COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None or hasattr(fn, '_mmsafe_original'):
            continue
        setattr(dist, name, _collective_wrapper(fn, name))


@HOOKS.register_module()
class HangWatchdogHook(Hook):
    """Write the stacks of a rank that stops making progress.

    Every rank keeps a heartbeat with its phase: ``data`` (between
    iterations: loading the next batch), ``forward``, ``backward`` (under
    DDP this includes the gradient all-reduce, a collective), ``optimizer
    step``, ``collective (<name>)`` for ``torch.distributed`` calls, hook
    events, and ``validation``. A watchdog thread checks it; when no
    progress was made for ``timeout`` seconds (``first_iter_timeout`` until
    the first iteration of an epoch ends, ``val_timeout`` during validation)
    it writes the stacks of all threads to ``{work_dir}/hang_rank{R}.txt``
    and to the log, naming the rank, iteration and phase. A rank that waits
    in a collective is usually the victim: look for the rank whose report
    shows another phase. When progress resumes, that is logged too.

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

    priority = 'LOWEST'

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
                raise ValueError(f'HangWatchdogHook: {name} must be > 0')
        self.timeout = float(timeout)
        self.first_iter_timeout = float(first_iter_timeout)
        self.val_timeout = float(val_timeout)
        self.abort_timeout = abort_timeout
        self.abort_exit_code = abort_exit_code
        shortest = min(self.timeout, self.first_iter_timeout,
                       self.val_timeout)
        self.poll_interval = poll_interval or min(5., max(.2, shortest / 10))
        self.native_backstop = native_backstop
        self._hb = _Heartbeat()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._runner = None
        self._ddp = False
        self._stalls = 0
        self._restore: list = []

    # ------------------------------------------------------------ beats --
    def beat(self, phase: Optional[str] = None) -> str:
        """Record progress (and a new phase); returns the previous phase."""
        hb = self._hb
        previous = hb.phase
        if phase is not None:
            hb.phase = phase
        hb.time = time.monotonic()
        hb.seq += 1
        return previous

    def _wrap_call_hook(self, runner) -> None:
        original = runner.call_hook

        @functools.wraps(original)
        def call_hook(fn_name: str, **kwargs) -> None:
            hb = self._hb
            if fn_name in ('before_train', 'before_train_epoch'):
                hb.first = True
            if 'batch_idx' in kwargs:
                hb.batch_idx = kwargs['batch_idx']
            previous = self.beat(f'hooks ({fn_name})')
            try:
                return original(fn_name, **kwargs)
            finally:
                if fn_name == 'after_train_iter':
                    hb.first = False
                self.beat(_PHASE_AFTER.get(fn_name, previous))

        runner.call_hook = call_hook
        self._restore.append((runner, 'call_hook', call_hook))

    def _wrap_optim_wrapper(self, optim_wrapper: Any) -> None:
        inner = getattr(optim_wrapper, 'optim_wrappers', None)
        if isinstance(inner, dict):  # OptimWrapperDict
            for wrapper in inner.values():
                self._wrap_optim_wrapper(wrapper)
            return
        backward = 'backward (DDP gradient all-reduce: a collective)' \
            if self._ddp else 'backward'
        for method, phase, after in (
                ('update_params', None, 'after optimizer step'),
                ('backward', backward, None),
                ('step', 'optimizer step', None),
                ('zero_grad', 'optimizer step (zero_grad)', None)):
            original = getattr(optim_wrapper, method, None)
            if original is None:
                continue

            def wrapped(*args, _original=original, _phase=phase,
                        _after=after, **kwargs):
                previous = self.beat(_phase)
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.beat(_after or previous)

            # Keep the wrapped method's attributes: MMEngine's param
            # schedulers mark `step` with `_with_counter` and warn when the
            # mark disappears.
            functools.update_wrapper(wrapped, original)
            setattr(optim_wrapper, method, wrapped)
            self._restore.append((optim_wrapper, method, wrapped))

    # ------------------------------------------------------------ hooks --
    def before_run(self, runner) -> None:
        global _ACTIVE
        from mmengine.dist import get_rank, get_world_size
        from mmengine.model import is_model_wrapper
        self._runner = runner
        self._rank = get_rank()
        self._world_size = get_world_size()
        self._ddp = is_model_wrapper(runner.model) and self._world_size > 1
        self._wrap_call_hook(runner)
        from mmengine.optim import OptimWrapper, OptimWrapperDict
        if isinstance(runner.optim_wrapper, (OptimWrapper, OptimWrapperDict)):
            # Built before `before_run` by `Runner.train`.
            self._wrap_optim_wrapper(runner.optim_wrapper)
        if torch.distributed.is_available() and \
                torch.distributed.is_initialized():
            _install_collective_markers()
        _ACTIVE = self
        self.beat(_PHASE_AFTER['before_run'])
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, name='mmsafe-hang-watchdog', daemon=True)
        self._thread.start()

    def after_run(self, runner) -> None:
        global _ACTIVE
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_interval * 2 + 1)
        if self.native_backstop:
            faulthandler.cancel_dump_traceback_later()
        if _ACTIVE is self:
            _ACTIVE = None
        for owner, name, wrapper in reversed(self._restore):
            # Only undo our own wrapper (back to the class's method).
            if vars(owner).get(name) is wrapper:
                delattr(owner, name)
        self._restore.clear()

    # --------------------------------------------------------- watchdog --
    def _allowance(self, phase: str, first: bool) -> float:
        if phase.startswith(('validation', 'test')):
            return self.val_timeout
        if first:
            return self.first_iter_timeout
        return self.timeout

    def _watch(self) -> None:
        stalled_seq = None
        stalled_at = 0.
        while True:
            stopping = self._stop.wait(self.poll_interval)
            hb = self._hb
            seq, last, phase, first = hb.seq, hb.time, hb.phase, hb.first
            if stalled_seq is not None and seq != stalled_seq:
                log(f'rank {self._rank} makes progress again after '
                    f'{last - stalled_at:.1f} s (phase now {phase!r}).',
                    logging.WARNING)
                stalled_seq = None
            if stopping:
                return
            allowance = self._allowance(phase, first)
            idle = time.monotonic() - last
            if self.native_backstop:
                # Fires only if this thread is starved of the GIL.
                try:
                    faulthandler.dump_traceback_later(
                        allowance + 10 * self.poll_interval + 30,
                        exit=False)
                except (RuntimeError, ValueError, OSError):
                    self.native_backstop = False  # no usable stderr
            if idle <= allowance:
                continue
            if stalled_seq is None:
                stalled_seq, stalled_at = seq, last
                self._report(phase, idle, allowance)
            elif self.abort_timeout is not None and \
                    idle > allowance + self.abort_timeout:
                self._abort(phase, idle)

    def _where(self) -> Dict[str, Any]:
        runner = self._runner
        where = dict(rank=self._rank, world_size=self._world_size)
        for key in ('iter', 'epoch'):
            try:
                where[key] = getattr(runner, key)
            except Exception:  # noqa: BLE001  (loop not built yet)
                where[key] = None
        where['batch_idx'] = self._hb.batch_idx
        return where

    def _stacks(self) -> str:
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        main = threading.main_thread().ident
        order = sorted(frames, key=lambda ident: ident != main)
        parts = []
        for ident in order:
            if ident == threading.get_ident():
                continue  # this watchdog thread
            stack = ''.join(traceback.format_stack(frames[ident]))
            parts.append(f'--- thread {names.get(ident, "?")} '
                         f'(id {ident}) ---\n{stack}')
        return '\n'.join(parts)

    @staticmethod
    def _innermost(ident: int) -> str:
        frame = sys._current_frames().get(ident)
        if frame is None:
            return '?'
        code = frame.f_code
        return f'{code.co_name} ({code.co_filename}:{frame.f_lineno})'

    def _report(self, phase: str, idle: float, allowance: float) -> None:
        self._stalls += 1
        where = self._where()
        main_at = self._innermost(threading.main_thread().ident)
        header = (
            f'mmsafe hang report: rank {where["rank"]} of '
            f'{where["world_size"]} (pid {os.getpid()}, '
            f'{socket.gethostname()}) made no progress for {idle:.1f} s '
            f'(allowed {allowance:g} s) at iteration {where["iter"]} '
            f'(epoch {where["epoch"]}, batch {where["batch_idx"]}), '
            f'phase {phase!r}.\nmain thread is in {main_at}')
        if 'collective' in phase:
            header += ('\nThis rank waits in a collective: another rank has '
                       'probably stalled or died. Compare the hang_rank*.txt '
                       'reports of all ranks.')
        elif phase.endswith('data'):
            header += ('\nThis rank waits for its DataLoader: a worker may '
                       'be stuck; num_workers=0 in the loader config rules '
                       'worker deadlocks out (see DataLoaderProbeHook).')
        report = f'{header}\n\n{self._stacks()}\n'
        path = None
        work_dir = getattr(self._runner, 'work_dir', None)
        if work_dir:
            path = osp.join(work_dir, f'hang_rank{where["rank"]}.txt')
            with open(path, 'a', encoding='utf-8') as f:
                f.write(f'===== {time.strftime("%Y-%m-%d %H:%M:%S")} '
                        f'=====\n{report}\n')
        log(f'{report}(written to {path})', logging.ERROR)
        write_event(work_dir, 'hang', phase=phase, idle_s=round(idle, 1),
                    allowance_s=allowance, main_thread=main_at, file=path,
                    **where)
        update_counters('hang_watchdog', stalls=self._stalls,
                        last_phase=phase, last_iter=where['iter'])

    def _abort(self, phase: str, idle: float) -> None:
        where = self._where()
        log(f'HangWatchdogHook: aborting rank {where["rank"]}: no progress '
            f'for {idle:.1f} s at iteration {where["iter"]}, phase '
            f'{phase!r}. Exiting with code {self.abort_exit_code} so that '
            'the launcher or scheduler can restart the job (resume with '
            '--resume). Set abort_timeout=None to wait instead.',
            logging.ERROR)
        write_event(getattr(self._runner, 'work_dir', None), 'hang_abort',
                    phase=phase, idle_s=round(idle, 1),
                    exit_code=self.abort_exit_code, **where)
        for handler in logging.getLogger().handlers + list(getattr(
                getattr(self._runner, 'logger', None), 'handlers', [])):
            try:
                handler.flush()
            except Exception:  # noqa: BLE001
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.abort_exit_code)


install_default_dist_timeout()

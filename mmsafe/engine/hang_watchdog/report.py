"""The hang report of one rank: a file, the log, an event, counters."""
import logging
import os
import os.path as osp
import socket
import sys
import time
from typing import Any, Dict

from mmsafe.guard_outputs import CounterKey, Event
from mmsafe.events import log, update_counters, write_event
from .stacks import all_stacks, collective_of, describe, main_frame
from .heartbeat import DATA

#: Exit code of an aborted rank (EX_TEMPFAIL: "try again later").
ABORT_EXIT_CODE = 75


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

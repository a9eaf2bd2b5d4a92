"""How fast do mmsafe's guards catch a fault, and what does recovery cost?

Three real training runs with injected faults (the toys of the test suite),
each through ``tools/train.py`` with a hard timeout:

1. stuck worker: spawn-started DataLoader workers that block forever
   (the Windows LLVIP deadlock), ``DataLoaderProbeHook(timeout=D)``;
   measured from the start of ``before_train`` (a clock hook that runs
   before the probe) until the fallback event and until the first training
   iteration on the rebuilt loader. Reported as seconds past D.
2. stalled rank: under 2-rank gloo DDP, rank 1's forward sleeps at one
   iteration; ``HangWatchdogHook(timeout=T)``; measured from the start of
   that iteration (clock hook) until each rank's stack dump (the ``hang``
   event, written after ``hang_rank{R}.txt``). Reported as seconds past T.
3. NaN: under 2-rank gloo DDP, rank 1's loss is NaN at one iteration;
   ``NaNSkipOptimWrapper``. Reported: iterations from the fault to the skip
   (0 = caught at the step it happened), steps lost beyond the faulty one
   (target 0), and whether the parameters are finite and identical on both
   ranks at the end.

    python benchmarks/detect_recover.py
    python benchmarks/detect_recover.py --probe-timeout 5 --watchdog-timeout 5
"""
import argparse
import json
import os.path as osp
import shutil
import sys
import tempfile
import time
from typing import Optional

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks._common import machine, revision, uptime  # noqa: E402
from mmsafe.events import read_events  # noqa: E402
from tests.utils import run_train, write_config  # noqa: E402

PROBE_CONFIG = """
default_scope = 'mmdet'
custom_imports = dict(
    imports=['mmsafe', 'tests.engine.probe_toys', 'benchmarks.clock_hook'],
    allow_failed_imports=False)
model = dict(type='ProbeToyModel')
train_dataloader = dict(
    batch_size=2, num_workers=2, persistent_workers=True,
    multiprocessing_context='spawn',
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='ProbeToyDataset', length=8,
                 block_in_spawn_worker=True, paired=True))
train_cfg = dict(type='IterBasedTrainLoop', max_iters=2)
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=1),
    checkpoint=dict(type='CheckpointHook', interval=1000, save_last=False))
custom_hooks = [dict(type='DataLoaderProbeHook', timeout={timeout}),
                dict(type='BenchClockHook')]
randomness = dict(seed=0)
work_dir = '{work_dir}'
"""

WATCHDOG_CONFIG = """
default_scope = 'mmdet'
custom_imports = dict(
    imports=['mmsafe', 'tests.engine.watchdog_toys', 'benchmarks.clock_hook'],
    allow_failed_imports=False)
model = dict(type='SleepyToyModel', stall_iter={stall_iter},
             stall_seconds={stall_seconds}, stall_rank=1)
train_dataloader = dict(
    batch_size=2, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='SleepyToyDataset', length=16))
train_cfg = dict(type='IterBasedTrainLoop', max_iters={iters})
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=1),
    checkpoint=dict(type='CheckpointHook', interval=1000, save_last=False))
custom_hooks = [dict(type='HangWatchdogHook', timeout={timeout},
                     first_iter_timeout=300),
                dict(type='BenchClockHook')]
work_dir = '{work_dir}'
"""


def _clock(work_dir: str, rank: int = 0) -> list:
    with open(osp.join(work_dir, f'clock_rank{rank}.json')) as f:
        return json.load(f)


def _check(result, what: str) -> None:
    if result.timed_out or result.returncode != 0:
        raise RuntimeError(f'{what} run failed: {result!r}')


def stuck_worker(root: str, deadline: float, timeout: float) -> dict:
    work_dir = osp.join(root, 'probe')
    cfg = write_config(osp.join(root, 'probe_cfg.py'), PROBE_CONFIG.format(
        timeout=deadline, work_dir=work_dir))
    result = run_train(cfg, timeout=timeout)
    _check(result, 'stuck-worker')
    clock = _clock(work_dir)
    start = next(t for e, _, t in clock if e == 'before_train')
    first_iter = next(t for e, _, t in clock if e == 'before_train_iter')
    (event, ) = read_events(work_dir, 'dataloader_fallback')
    return dict(
        deadline_s=deadline, probe_reported_s=event['seconds'],
        to_fallback_s=event['time'] - start,
        past_deadline_fallback_s=event['time'] - start - deadline,
        past_deadline_training_s=first_iter - start - deadline,
        leaked_workers=event['leaked_workers'])


def stalled_rank(root: str, deadline: float, timeout: float,
                 stall_seconds: Optional[float] = None) -> dict:
    work_dir = osp.join(root, 'watchdog')
    stall_iter = 3
    if stall_seconds is None:
        stall_seconds = deadline * 2 + 10
    cfg = write_config(
        osp.join(root, 'watchdog_cfg.py'), WATCHDOG_CONFIG.format(
            stall_iter=stall_iter, stall_seconds=stall_seconds,
            iters=stall_iter + 3, timeout=deadline, work_dir=work_dir))
    result = run_train(cfg, nproc=2, timeout=timeout)
    _check(result, 'stalled-rank')
    out = dict(deadline_s=deadline)
    events = read_events(work_dir, 'hang')
    for rank in (0, 1):
        start = next(t for e, it, t in _clock(work_dir, rank)
                     if e == 'before_train_iter' and it == stall_iter)
        hang = [e for e in events if e['rank'] == rank]
        if not hang:
            out[f'rank{rank}_past_deadline_s'] = None
            continue
        out[f'rank{rank}_past_deadline_s'] = hang[0]['time'] - start \
            - deadline
        out[f'rank{rank}_phase'] = hang[0]['phase']
        out[f'rank{rank}_dump'] = osp.exists(
            osp.join(work_dir, f'hang_rank{rank}.txt'))
    return out


def nan_skip(root: str, timeout: float) -> dict:
    from tests.engine import step_toys_runs as runs
    fault_iter, iters = 3, 8
    work_dir = osp.join(root, 'nan')
    cfg = runs.make_config(work_dir, runs.fault(1, fault_iter, 'nan_loss'),
                           iters, runs.sgd_wrapper())
    result = run_train(cfg, nproc=2, timeout=timeout)
    _check(result, 'NaN')
    d0, d1 = runs.dumps(work_dir)
    sums = runs.checksums(d0)  # parameter checksum after iteration i
    skips = sorted({e['iter'] for e in read_events(work_dir, 'step_skip')})
    # A skipped step leaves the parameters as they were.
    unchanged = [i for i in sorted(sums)[1:] if sums[i] == sums[i - 1]]
    identical = all(
        runs.bit_identical(v, d1['state_dict'][k])
        for k, v in d0['state_dict'].items())
    finite = all(bool(v.isfinite().all()) for v in d0['state_dict'].values()
                 if v.is_floating_point())
    return dict(fault_iter=fault_iter, skip_iters=skips,
                detect_latency_iters=(skips[0] - fault_iter) if skips
                else None,
                steps_lost_beyond_fault=max(0, len(skips) - 1),
                unchanged_after_records=unchanged,
                counters=d0['counters'], ranks_identical=identical,
                finite=finite)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument('--probe-timeout', type=float, default=10.)
    parser.add_argument('--watchdog-timeout', type=float, default=10.)
    parser.add_argument('--stall-seconds', type=float, default=None,
                        help='how long rank 1 sleeps in the stalled-rank run '
                        '(default: twice --watchdog-timeout + 10); it must '
                        'outlast the watchdog deadline and both stack dumps')
    parser.add_argument('--run-timeout', type=float, default=420.,
                        help='hard limit per training run (s)')
    parser.add_argument('--only', choices=['worker', 'rank', 'nan'],
                        nargs='*', default=['worker', 'rank', 'nan'])
    args = parser.parse_args()
    if args.stall_seconds is not None and \
            args.stall_seconds <= args.watchdog_timeout:
        parser.error('--stall-seconds must be longer than '
                     '--watchdog-timeout')
    root = tempfile.mkdtemp(prefix='mmsafe_bench_detect_')
    print(f'machine: {machine()}')
    print(f'revision: {revision()}')
    print(f'uptime before: {uptime()}')
    try:
        if 'worker' in args.only:
            start = time.monotonic()
            r = stuck_worker(root, args.probe_timeout, args.run_timeout)
            print(f'\n== stuck DataLoader worker (spawn, blocks forever), '
                  f'probe deadline {r["deadline_s"]:g} s ==')
            print(f'fallback done: {r["past_deadline_fallback_s"]:.2f} s past '
                  f'the deadline (probe reports {r["probe_reported_s"]:.2f} '
                  f's; {r["leaked_workers"]} leaked workers)')
            print('first training iteration on the num_workers=0 loader: '
                  f'{r["past_deadline_training_s"]:.2f} s past the deadline')
            print(f'(run wall {time.monotonic() - start:.1f} s)')
        if 'rank' in args.only:
            r = stalled_rank(root, args.watchdog_timeout, args.run_timeout,
                             args.stall_seconds)
            print(f'\n== stalled rank (2-rank gloo DDP, rank 1 sleeps in '
                  f'forward), watchdog deadline {r["deadline_s"]:g} s ==')
            for rank in (0, 1):
                past = r[f'rank{rank}_past_deadline_s']
                if past is None:
                    print(f'rank {rank}: NO stack dump')
                else:
                    print(f'rank {rank}: stack dump {past:.2f} s past the '
                          f'deadline (phase {r[f"rank{rank}_phase"]!r}, file '
                          f'written: {r[f"rank{rank}_dump"]})')
        if 'nan' in args.only:
            r = nan_skip(root, args.run_timeout)
            print('\n== NaN loss on rank 1 at iteration '
                  f'{r["fault_iter"]} (2-rank gloo DDP, NaNSkipOptimWrapper) '
                  '==')
            print(f'skipped iterations: {r["skip_iters"]}; iterations from '
                  f'fault to skip: {r["detect_latency_iters"]}; steps lost '
                  f'beyond the faulty one: {r["steps_lost_beyond_fault"]}')
            print('iterations after which the parameters did not change: '
                  f'{r["unchanged_after_records"]}')
            print(f'parameters finite: {r["finite"]}, identical on both '
                  f'ranks: {r["ranks_identical"]}; counters: '
                  f'{r["counters"]}')
    finally:
        print(f'uptime after: {uptime()}')
        shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
    main()

"""Helpers shared by the benchmark scripts: machine description, robust
statistics, and counting of collectives and host synchronisations."""
import os
import os.path as osp
import platform
import statistics
import subprocess
import sys
from collections import Counter
from typing import Callable, Dict, List, Sequence

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
MMSAFE_DIR = osp.join(REPO_ROOT, 'mmsafe') + os.sep
DEMO_CONFIG = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
SAFETY_RUNTIME = osp.join(REPO_ROOT, 'configs', '_base_',
                          'safety_runtime.py')


def uptime() -> str:
    """`uptime` output (the machine is shared: record its load)."""
    try:
        return subprocess.run(['uptime'], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception as exc:  # uptime missing: say so, do not fail
        return f'uptime unavailable ({exc})'


def machine() -> str:
    import torch
    return (f'{platform.processor() or platform.machine()}, '
            f'{os.cpu_count()} cores, python {sys.version.split()[0]}, '
            f'torch {torch.__version__}, '
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")


def revision() -> str:
    """The commit measured, and whether the demo config differs from it."""
    def git(*args):
        return subprocess.run(['git', *args], cwd=REPO_ROOT,
                              capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        head = git('rev-parse', '--short', 'HEAD')
        dirty = git('status', '--porcelain', '--', DEMO_CONFIG)
    except Exception as exc:  # no git: say so, do not fail
        return f'unknown ({exc})'
    return f"{head}{' (demo config modified)' if dirty else ''}"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float('nan')


def ci_of_ratio(on: List[float], off: List[float], reps: int = 2000,
                seed: int = 0):
    """Bootstrap 95% interval of median(on) / median(off)."""
    import random
    if len(on) < 2 or len(off) < 2:
        return float('nan'), float('nan')
    rng = random.Random(seed)
    ratios = []
    for _ in range(reps):
        a = [rng.choice(on) for _ in on]
        b = [rng.choice(off) for _ in off]
        ratios.append(median(a) / median(b))
    ratios.sort()
    return ratios[int(0.025 * reps)], ratios[int(0.975 * reps) - 1]


_SYNC_METHODS = ('item', 'tolist', 'cpu', 'numpy', '__float__', '__int__',
                 '__bool__')
_COLLECTIVES = (
    'all_reduce', 'all_gather', 'all_gather_object', 'all_gather_into_tensor',
    'broadcast', 'broadcast_object_list', 'reduce', 'reduce_scatter',
    'gather', 'gather_object', 'scatter', 'barrier', 'monitored_barrier')


#: mmsafe's guards (not its model or data code, which are the workload).
GUARD_DIRS = tuple(
    osp.join(MMSAFE_DIR, d)
    for d in ('engine' + os.sep, 'dist.py', 'events.py',
              'checkpoint' + os.sep))
_TORCH_TENSOR_HELPERS = ('torch' + os.sep + '_tensor.py',
                         'torch' + os.sep + 'overrides.py')


def _site(frame) -> str:
    """The code that asked for the value: ``frame``, the immediate caller
    (past torch's own Tensor helpers), as 'path:function:line' when it is an
    mmsafe guard, else '(not mmsafe)'. Calls made by code that a guard merely
    calls into (the optimizer under an optim wrapper, a hook under the
    watchdog's call_hook wrapper) are not the guard's."""
    while frame is not None and frame.f_code.co_filename.endswith(
            _TORCH_TENSOR_HELPERS):
        frame = frame.f_back
    if frame is None:
        return '(not mmsafe)'
    filename = frame.f_code.co_filename
    if filename.startswith(GUARD_DIRS):
        return (f'{osp.relpath(filename, REPO_ROOT)}:'
                f'{frame.f_code.co_name}:{frame.f_lineno}')
    return '(not mmsafe)'


class MethodCounter:
    """Counts the calls of methods it replaces on their owner (a class or a
    module) while installed, each under ``key(name, caller_frame)``.

    Only for a counting phase: it slows every call down, so timed
    iterations never run with it installed.
    """

    def __init__(self) -> None:
        self._saved: Dict = {}

    def count(self, owner, name: str, counter: Counter,
              key: Callable) -> None:
        original = getattr(owner, name, None)
        if original is None or (owner, name) in self._saved:
            return
        self._saved[(owner, name)] = original

        def counted(*args, **kwargs):
            counter[key(name, sys._getframe(1))] += 1
            return original(*args, **kwargs)

        setattr(owner, name, counted)

    def remove(self) -> None:
        for (owner, name), original in self._saved.items():
            setattr(owner, name, original)
        self._saved.clear()


class CallCounter(MethodCounter):
    """Counts Python-level torch.distributed collectives and tensor -> host
    conversions (``.item()``, ``float(t)``, ``.cpu()``, ...; each is a device
    synchronisation on CUDA), keyed by the mmsafe frame that caused them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.syncs: Counter = Counter()
        self.collectives: Counter = Counter()

    def install(self) -> None:
        import torch
        import torch.distributed as dist

        def key(name, frame):
            return name, _site(frame)

        for name in _SYNC_METHODS:
            self.count(torch.Tensor, name, self.syncs, key)
        for name in _COLLECTIVES:
            self.count(dist, name, self.collectives, key)

    def summary(self) -> dict:

        def split(counter: Counter) -> dict:
            total = sum(counter.values())
            mmsafe = {f'{n} @ {s}': c for (n, s), c in counter.items()
                      if s != '(not mmsafe)'}
            return dict(total=total, mmsafe=sum(mmsafe.values()),
                        mmsafe_sites=mmsafe)

        return dict(syncs=split(self.syncs),
                    collectives=split(self.collectives))


def guard_profile(profiler, top: int = 12) -> dict:
    """Self time (excluding callees) of mmsafe guard code in a cProfile run:
    what the guards themselves add, whatever they call into."""
    import pstats
    stats = pstats.Stats(profiler).stats
    rows = []
    for (filename, lineno, func), (_, calls, tottime, cumtime,
                                   _) in stats.items():
        if filename.startswith(GUARD_DIRS):
            rows.append(dict(
                site=f'{osp.relpath(filename, REPO_ROOT)}:{func}:{lineno}',
                calls=calls, self_s=tottime, cum_s=cumtime))
    by_cum = sorted(rows, key=lambda r: -r['cum_s'])[:top]
    rows.sort(key=lambda r: -r['self_s'])
    total = sum(tt for (_, _, tt, _, _) in stats.values())
    return dict(guard_self_s=sum(r['self_s'] for r in rows),
                total_self_s=total, top=rows[:top], top_cum=by_cum)

"""DataLoader arguments are valid for their ``num_workers`` and platform.

PyTorch raises on ``persistent_workers=True`` or a ``prefetch_factor`` with
``num_workers=0`` only when the loader is built, after the model and dataset.
Spawn-started workers (Windows always; elsewhere
``env_cfg.mp_cfg.mp_start_method='spawn'``) re-import everything and pickle
the dataset; with paired data and persistent workers such workers can stall
right after the hooks are set up, printing nothing.

``DataLoaderProbeHook`` is promised only where it acts in time: an
``IterBasedTrainLoop`` starts its loader's workers when it is built, before
any ``before_train`` hook, so the probe comes first only when
``SafeRunner`` builds mmsafe's loop in its place
(:func:`train_probe_in_time`).
"""
import multiprocessing
import os
from typing import Dict, Iterator, Optional, Tuple

from mmsafe.datasets.loader.inflight_memory import (DEFAULT_PREFETCH,
                                                    available_memory,
                                                    local_processes)
from ..context import PreflightContext
from ..report import CheckRow

NAME = 'dataloader'

PROBE_HOOK = 'DataLoaderProbeHook'
# What a spawn-started worker costs before it loads anything: its own
# Python with torch, MMEngine and MMDetection imported (measured RSS).
SPAWN_WORKER_BYTES = 400 * 2**20


def _memory_rows(ctx: PreflightContext, name: str, loader: Dict,
                 workers: int, method: str) -> Iterator[CheckRow]:
    """Estimate what the workers hold in flight against free memory."""
    item = ctx.state.get('item_bytes', {}).get(name, 0)
    available = available_memory()
    if not workers or not item or not available:
        return
    prefetch = loader.get('prefetch_factor', None) or DEFAULT_PREFETCH
    batch = loader.get('batch_size', 1)
    if not isinstance(batch, int) or not isinstance(prefetch, int):
        return
    # every rank of this machine runs its own workers
    local = local_processes(default=ctx.world_size)
    per_rank = workers * prefetch * batch * item + (
        workers * SPAWN_WORKER_BYTES if method == 'spawn' else 0)
    need = per_rank * local
    detail = (f'{local} process(es) x {workers} workers x prefetch '
              f'{prefetch} x batch {batch} x {item / 2**20:.1f} MiB per '
              f'sample{" + spawned interpreters" if method == "spawn" else ""}'
              f' = {need / 2**30:.2f} GiB in flight; {available / 2**30:.1f} '
              'GiB available')
    fix = (f'Lower {name}.num_workers or {name}.prefetch_factor (e.g. 4 '
           'workers x prefetch 2), or the batch size.')
    if need > available:
        yield CheckRow('error', NAME, f'The loader would exhaust memory: '
                       f'{detail}.', f'{name}.num_workers', fix)
    elif need > available / 2:
        yield CheckRow('warn', NAME, f'The loader needs much of the free '
                       f'memory: {detail}.', f'{name}.num_workers', fix)


def start_method(ctx: PreflightContext, loader: Dict) -> str:
    """The start method the loader's workers will use in this run."""
    context = loader.get('multiprocessing_context', None)
    if isinstance(context, str):
        return context
    if ctx.system == 'Windows':
        return 'spawn'
    # MMEngine's Runner.setup_env sets this method (default 'fork') on
    # every platform but Windows.
    mp_cfg = (ctx.cfg.get('env_cfg', None) or {}).get('mp_cfg', None) or {}
    method = mp_cfg.get('mp_start_method', None)
    if method:
        return method
    if ctx.cfg.get('env_cfg', None) is not None:
        return 'fork'
    return multiprocessing.get_start_method(allow_none=True) or 'fork'


def _probe_hook_on(ctx: PreflightContext) -> bool:
    hooks = ctx.cfg.get('custom_hooks', None) or []
    return any(isinstance(h, dict) and h.get('type') == PROBE_HOOK
               for h in hooks)


def train_probe_in_time(ctx: PreflightContext) -> Tuple[bool, str]:
    """Whether DataLoaderProbeHook probes the train loader before its loop
    starts the workers, and why (or why not)."""
    from mmengine.runner import IterBasedTrainLoop
    from mmsafe.engine.loops import ResumableIterBasedTrainLoop
    train_cfg = ctx.cfg.get('train_cfg', None) or {}
    kind = train_cfg.get('type', None)
    if kind is None:
        kind = 'IterBasedTrainLoop' if train_cfg.get(
            'by_epoch', True) is False else 'EpochBasedTrainLoop'
    loop = ctx.lookup('LOOPS', kind) if isinstance(kind, str) else kind
    if not (isinstance(loop, type) and issubclass(loop, IterBasedTrainLoop)):
        return True, 'before training'
    name = loop.__name__
    if issubclass(loop, ResumableIterBasedTrainLoop):
        return True, f'before {name} starts its workers'
    runner = ctx.cfg.get('runner_type', None)
    if loop is IterBasedTrainLoop and runner in (None, 'SafeRunner'):
        how = ("(SafeRunner builds mmsafe's loop, which probes first)"
               if runner else
               "(mmsafe's tools/train.py runs SafeRunner, which probes "
               "first; MMDetection's tools/train.py needs "
               "runner_type='SafeRunner' for that)")
        return True, f'before {name} starts its workers {how}'
    return False, (
        f'{name} starts its loader\'s workers when it is built, before '
        'DataLoaderProbeHook\'s before_train: a dataset that they cannot '
        'receive (an unpicklable transform) ends the run before the probe '
        'can fall back' + ('' if loop is IterBasedTrainLoop else
                           ' (SafeRunner replaces only MMEngine\'s own '
                           'IterBasedTrainLoop)'))


def _int(value) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def check_dataloader_args(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Check worker count, persistence, prefetching and start method."""
    cpus = os.cpu_count() or 1
    paired = ctx.state.get('paired', {})
    for name, loader in ctx.dataloaders():
        errors = 0
        raw_workers = loader.get('num_workers', 0)
        workers = _int(raw_workers)
        persistent = loader.get('persistent_workers', False)
        prefetch = loader.get('prefetch_factor', None)
        if workers is None or workers < 0:
            errors += 1
            yield CheckRow(
                'error', NAME, f'num_workers={raw_workers!r} is not a '
                'non-negative integer (PyTorch raises ValueError).',
                f'{name}.num_workers', 'Use 0 (load in the main process) or '
                'a positive integer.')
            continue
        if 'sampler' not in loader and 'batch_sampler' not in loader:
            errors += 1
            yield CheckRow(
                'error', NAME, f'{name} has no sampler (MMEngine raises '
                "KeyError: 'sampler').", f'{name}.sampler',
                "Add sampler=dict(type='DefaultSampler', shuffle=True) "
                '(False for val/test).')
        if workers == 0 and persistent:
            errors += 1
            yield CheckRow(
                'error', NAME, 'persistent_workers=True with num_workers=0: '
                'PyTorch raises "persistent_workers option needs '
                'num_workers > 0".', f'{name}.persistent_workers',
                f'Set {name}.persistent_workers=False, or num_workers > 0.')
        if workers == 0 and prefetch is not None:
            errors += 1
            yield CheckRow(
                'error', NAME, f'prefetch_factor={prefetch!r} with '
                'num_workers=0: PyTorch raises "prefetch_factor option could '
                'only be specified in multiprocessing".',
                f'{name}.prefetch_factor',
                f'Remove {name}.prefetch_factor (or set it to None), or use '
                'num_workers > 0.')
        elif prefetch is not None and (_int(prefetch) is None
                                       or prefetch < 0):
            errors += 1
            yield CheckRow(
                'error', NAME, f'prefetch_factor={prefetch!r} must be a '
                'non-negative integer.', f'{name}.prefetch_factor',
                'Use 2 (PyTorch default) or remove it.')
        timeout = loader.get('timeout', 0)
        if isinstance(timeout, (int, float)) and timeout < 0:
            errors += 1
            yield CheckRow('error', NAME, f'timeout={timeout} is negative.',
                           f'{name}.timeout', 'Use 0 (no timeout) or > 0.')
        if workers > cpus:
            yield CheckRow(
                'warn', NAME, f'num_workers={workers} is more than the '
                f'{cpus} CPU cores of this machine (per process).',
                f'{name}.num_workers', f'Use at most {cpus}; more workers '
                'only add memory (each holds prefetch_factor batches).')
        method = start_method(ctx, loader)
        in_time, when = (train_probe_in_time(ctx) if name ==
                         'train_dataloader' else (True, 'before training'))
        if workers > 0 and method in ('spawn', 'forkserver') and \
                _probe_hook_on(ctx) and not in_time:
            yield CheckRow(
                'warn', NAME, f'{workers} {method}-started workers: {when}.',
                f'{name}.num_workers',
                "Set runner_type='SafeRunner' (it builds mmsafe's "
                'ResumableIterBasedTrainLoop for IterBasedTrainLoop, which '
                'probes the loader first), or train_cfg.type='
                "'ResumableIterBasedTrainLoop'.")
        elif workers > 0 and method == 'spawn':
            is_paired = paired.get(name, False)
            if is_paired and _probe_hook_on(ctx):
                yield CheckRow(
                    'info', NAME, f'{workers} spawn-started workers on '
                    f'paired data: DataLoaderProbeHook probes them {when} '
                    'and falls back to num_workers=0 if they stall.',
                    f'{name}.num_workers')
            elif is_paired:
                yield CheckRow(
                    'warn', NAME, f'{workers} workers start with spawn '
                    f'({ctx.system}) on paired visible+infrared data'
                    f'{" with persistent_workers=True" if persistent else ""}'
                    ': this combination has deadlocked right after the hooks '
                    'were set up, printing nothing more.',
                    f'{name}.num_workers',
                    f'Set {name}.num_workers=0 and '
                    f'{name}.persistent_workers=False (about 10% slower, '
                    "stable), or add custom_hooks=[dict(type='"
                    f"{PROBE_HOOK}')] to probe workers and fall back.")
            else:
                yield CheckRow(
                    'info', NAME, f'{workers} workers start with spawn: each '
                    'imports the config\'s modules and unpickles the '
                    'dataset; the first batch comes later than with fork.',
                    f'{name}.num_workers')
        memory = list(_memory_rows(ctx, name, loader, workers, method))
        errors += sum(r.status == 'error' for r in memory)
        yield from memory
        if not errors:
            yield CheckRow(
                'ok', NAME, f'num_workers={workers}, persistent_workers='
                f'{bool(persistent)}, prefetch_factor={prefetch}, start '
                f'method {method}.', name)

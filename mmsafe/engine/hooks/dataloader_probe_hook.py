"""Probe each DataLoader before its first batch; fall back to the main
process when its workers cannot deliver.

Spawn-started workers (Windows, macOS, or ``multiprocessing_context=
'spawn'``) receive a pickled copy of the dataset, collate_fn and
worker_init_fn; an unpicklable object fails there with a message that does
not say which object it was, and some worker set-ups (paired images,
persistent workers) deadlock without any message at all. The probe finds
both before training starts and rebuilds the loader without workers.
"""
import logging
import math
import os
import time
from typing import Any, Dict, Optional, Sequence

from mmengine.hooks import Hook
from torch.utils.data import DataLoader

from mmdet.registry import HOOKS
from mmsafe.events import log, update_counters, write_event
from mmsafe.rng import preserved_rng_state
from . import _loader_utils as lu

POLICIES = ('auto', 'always', 'off')


def _unwrap(dataset: Any, depth: int = 0) -> Any:
    """The innermost dataset of (nested) dataset wrappers."""
    if depth > 8:
        return dataset
    inner = getattr(dataset, 'dataset', None)
    if inner is None and getattr(dataset, 'datasets', None):
        inner = dataset.datasets[0]
    return dataset if inner is None else _unwrap(inner, depth + 1)


def is_paired_dataset(dataset: Any) -> bool:
    """Whether a dataset yields visible + infrared pairs (mmsafe's
    ``ir_img_path`` contract, or a class named ``*Pair*``)."""
    for ds in (dataset, _unwrap(dataset)):
        if 'pair' in type(ds).__name__.lower():
            return True
        get_info = getattr(ds, 'get_data_info', None)
        if get_info is None:
            continue
        try:
            info = get_info(0)
        except Exception:  # noqa: BLE001  (an empty or lazy dataset)
            continue
        if isinstance(info, dict) and ('ir_img_path' in info
                                       or 'ir_img' in info):
            return True
    return False


@HOOKS.register_module()
class DataLoaderProbeHook(Hook):
    """Check every DataLoader with workers before its first batch.

    Before the first training iteration (and before the first validation
    and test), for each loader with ``num_workers > 0``:

    1. it pickles the dataset, collate_fn and worker_init_fn the way a
       spawn-started worker receives them, and names the object that cannot
       be pickled (e.g. ``dataset.pipeline.transforms[3].fn: <lambda>``);
    2. it fetches the first batch from each worker through real worker
       processes with the loader's own settings (start method, prefetch
       factor, persistent workers, and a restart as the second epoch does
       for persistent workers), under a deadline; workers that do not
       answer are killed, and no worker process outlives the probe.

    When the workers cannot deliver, the loop's loader is rebuilt with the
    same dataset, sampler, batch sampler and collate_fn, with
    ``num_workers=0, persistent_workers=False`` and no prefetch factor,
    and one loud warning names the cause and the config line to change.
    An error that the dataset raises without workers as well is a bug in
    the data, not in the workers: it is raised, never hidden by a
    fallback. When the probe passes, the original loader is kept untouched.

    From the probed batch it also estimates the memory of the batches in
    flight, ``local ranks x num_workers x prefetch_factor x batch bytes``,
    warns when that exceeds the budget, and can cap the workers to fit.

    Args:
        policy (str): ``'auto'`` probes and falls back on a definite
            failure (unpicklable under spawn/forkserver, worker crash,
            deadline); a loader it cannot probe is kept with a warning,
            except for spawn/forkserver workers on paired (visible +
            infrared) data, which fall back unless the probe passes.
            ``'always'``: every outcome but a pass falls back. ``'off'``:
            do nothing. Defaults to ``'auto'``.
        timeout (float): seconds the workers get to deliver their first
            batches, worker start-up included. Defaults to 60.
        loaders (Sequence[str]): which loops' loaders to probe, among
            ``'train'``, ``'val'``, ``'test'``. Defaults to all three.
        memory_budget_mb (float, optional): budget for the batches in
            flight, in MiB, for all processes of this machine. Defaults to
            ``memory_fraction`` of the available RAM.
        memory_fraction (float): see ``memory_budget_mb``. Defaults to 0.5.
        cap_workers (bool): rebuild the loader with as many workers as fit
            the budget (at least 1). Defaults to False (only warn).
        paired (bool, optional): whether the data is paired (for
            ``'auto'``); detected from the dataset when None.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 policy: str = 'auto',
                 timeout: float = 60.,
                 loaders: Sequence[str] = ('train', 'val', 'test'),
                 memory_budget_mb: Optional[float] = None,
                 memory_fraction: float = 0.5,
                 cap_workers: bool = False,
                 paired: Optional[bool] = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f'DataLoaderProbeHook: policy must be one of '
                             f'{POLICIES}, got {policy!r}')
        if timeout <= 0:
            raise ValueError('DataLoaderProbeHook: timeout must be > 0')
        unknown = set(loaders) - {'train', 'val', 'test'}
        if unknown:
            raise ValueError(f'DataLoaderProbeHook: unknown loaders '
                             f'{sorted(unknown)}')
        self.policy = policy
        self.timeout = float(timeout)
        self.loaders = tuple(loaders)
        self.memory_budget_mb = memory_budget_mb
        self.memory_fraction = memory_fraction
        self.cap_workers = cap_workers
        self.paired = paired
        self._done: set = set()
        self._counts: Dict[str, Any] = dict(probed=0, passed=0, fallbacks=0,
                                            capped=0, memory_warnings=0,
                                            leaked_workers=0)

    # ------------------------------------------------------------ hooks --
    def before_train(self, runner) -> None:
        self._maybe_probe(runner, 'train', runner.train_loop)

    def before_val(self, runner) -> None:
        self._maybe_probe(runner, 'val', runner.val_loop)

    def before_test(self, runner) -> None:
        self._maybe_probe(runner, 'test', runner.test_loop)

    # --------------------------------------------------------- internals --
    def _maybe_probe(self, runner, name: str, loop: Any) -> None:
        if self.policy == 'off' or name not in self.loaders or \
                name in self._done or loop is None:
            return
        self._done.add(name)
        loader = getattr(loop, 'dataloader', None)
        if not isinstance(loader, DataLoader) or loader.num_workers == 0:
            return
        # Training must find every random stream (and with it the worker
        # seeds that the next epoch's iterator draws) as if no probe ran.
        with preserved_rng_state():
            self._probe(runner, name, loop, loader)

    def _probe(self, runner, name: str, loop: Any,
               loader: DataLoader) -> None:
        method = lu.start_method(loader)
        pickles = method in lu.PICKLING_START_METHODS
        paired = self.paired if self.paired is not None else \
            is_paired_dataset(loader.dataset)
        strict = self.policy == 'always' or (pickles and paired)
        settings = (f'num_workers={loader.num_workers}, persistent_workers='
                    f'{loader.persistent_workers}, prefetch_factor='
                    f'{loader.prefetch_factor}, start method {method!r}'
                    f'{", paired data" if paired else ""}')
        self._counts['probed'] += 1
        start = time.monotonic()

        if lu.is_iterable_dataset(loader):
            self._inconclusive(runner, name, loop, loader, strict, settings,
                               'an IterableDataset cannot be probed')
            return

        for part, obj in (('dataset', loader.dataset),
                          ('collate_fn', loader.collate_fn),
                          ('worker_init_fn', loader.worker_init_fn)):
            found = lu.find_unpicklable(obj, part)
            if found is None:
                continue
            path, what, error = found
            if pickles:
                cause = (f'{path} cannot be pickled for {method}-started '
                         f'workers: {what} ({error}). Replace it with a '
                         'module-level function or class')
                self._fallback(runner, name, loop, loader, settings, cause,
                               time.monotonic() - start)
                return
            log(f'DataLoaderProbeHook: the {name} loader works here with '
                f'{method!r} workers, but {path} ({what}) cannot be pickled, '
                'so it would fail under spawn (Windows, macOS) or '
                f'forkserver: {error}', logging.WARNING)
            break

        try:
            result = lu.probe_fetch(loader, self.timeout)
        except Exception as e:  # noqa: BLE001  (the probe itself failed)
            self._inconclusive(runner, name, loop, loader, strict, settings,
                               f'the probe could not run: '
                               f'{type(e).__name__}: {e}')
            return
        self._check_leak(runner, name, result['alive_after'])
        if not result['ok']:
            cause = result['error']
            if result['exception'] is not None:
                # A dataset that fails without workers too is broken: the
                # user must see that error, not a fallback.
                lu.fetch_in_process(loader)
                cause = (f'its workers failed ({cause}) while the same batch '
                         'loads without workers')
            elif result['timed_out']:
                cause = ('its workers did not deliver the first batches '
                         f'within the probe deadline of {self.timeout:g} s; '
                         'they were killed')
            self._fallback(runner, name, loop, loader, settings, cause,
                           result['seconds'])
            return

        self._counts['passed'] += 1
        batch_bytes = lu.nbytes(result['batch'])
        result['batch'] = None
        inflight = self._inflight_bytes(loader, batch_bytes)
        log(f'DataLoaderProbeHook: the {name} loader passed ({settings}): '
            f'first batches in {result["seconds"]:.1f} s, about '
            f'{batch_bytes / 2**20:.1f} MiB per batch, '
            f'{inflight / 2**20:.1f} MiB in flight on this machine.')
        write_event(runner.work_dir, 'dataloader_probe', loader=name,
                    result='pass', seconds=round(result['seconds'], 3),
                    batch_bytes=batch_bytes, inflight_bytes=inflight,
                    workers=loader.num_workers, start_method=method,
                    leaked_workers=len(result['alive_after']))
        self._publish(name, 'pass', result['seconds'], inflight)
        self._check_memory(runner, name, loop, loader, batch_bytes, inflight)

    def _inconclusive(self, runner, name, loop, loader, strict, settings,
                      reason: str) -> None:
        if strict:
            self._fallback(runner, name, loop, loader, settings,
                           f'{reason}, and workers are kept only when the '
                           'probe passes here', 0.0)
            return
        log(f'DataLoaderProbeHook: the {name} loader was not probed '
            f'({reason}); keeping {settings}.', logging.WARNING)
        write_event(runner.work_dir, 'dataloader_probe', loader=name,
                    result='not_probed', reason=reason)
        self._publish(name, 'not_probed', 0.0, None)

    def _fallback(self, runner, name, loop, loader, settings, cause: str,
                  seconds: float) -> None:
        new_loader = lu.rebuild_loader(loader, num_workers=0)
        alive = lu.replace_loop_loader(loop, new_loader)
        self._check_leak(runner, name, alive)
        self._counts['fallbacks'] += 1
        key = f'{name}_dataloader'
        log('\n' + '!' * 72 + '\n'
            f'DataLoaderProbeHook: FALLING BACK to num_workers=0 for the '
            f'{name} loader ({settings}).\n'
            f'Cause: {cause}.\n'
            'Training continues without worker processes (slower, but it '
            'cannot deadlock).\n'
            f'To choose this yourself, set in the config: {key} = dict('
            'num_workers=0, persistent_workers=False)  (or --cfg-options '
            f'{key}.num_workers=0 {key}.persistent_workers=False); to turn '
            "the probe off: custom_hooks = [dict(type='DataLoaderProbeHook', "
            "policy='off')].\n" + '!' * 72, logging.WARNING)
        write_event(runner.work_dir, 'dataloader_fallback', loader=name,
                    cause=cause, seconds=round(seconds, 3),
                    settings=settings, leaked_workers=len(alive))
        self._publish(name, 'fallback', seconds, None)

    def _check_leak(self, runner, name: str, alive) -> None:
        if not alive:
            return
        self._counts['leaked_workers'] += len(alive)
        log(f'DataLoaderProbeHook: worker processes {alive} of the {name} '
            'loader are still alive after being killed.', logging.ERROR)
        write_event(runner.work_dir, 'dataloader_leak', loader=name,
                    pids=list(alive))

    @staticmethod
    def _local_processes() -> int:
        return max(1, int(os.environ.get('LOCAL_WORLD_SIZE', '1') or 1))

    def _inflight_bytes(self, loader: DataLoader, batch_bytes: int) -> int:
        prefetch = loader.prefetch_factor or 2
        return (self._local_processes() * loader.num_workers * prefetch *
                batch_bytes)

    def _budget_bytes(self) -> Optional[int]:
        if self.memory_budget_mb is not None:
            return int(self.memory_budget_mb * 2**20)
        available = lu.available_memory()
        if available is None:
            return None
        return int(available * self.memory_fraction)

    def _check_memory(self, runner, name, loop, loader: DataLoader,
                      batch_bytes: int, inflight: int) -> None:
        budget = self._budget_bytes()
        if budget is None or batch_bytes == 0 or inflight <= budget:
            return
        prefetch = loader.prefetch_factor or 2
        per_worker = self._local_processes() * prefetch * batch_bytes
        fits = max(1, math.floor(budget / per_worker))
        key = f'{name}_dataloader'
        self._counts['memory_warnings'] += 1
        message = (
            f'DataLoaderProbeHook: the {name} loader keeps about '
            f'{inflight / 2**20:.1f} MiB of batches in flight '
            f'({self._local_processes()} process(es) x {loader.num_workers} '
            f'workers x prefetch_factor {prefetch} x '
            f'{batch_bytes / 2**20:.2f} MiB per batch, estimated from the '
            f'first batch), over the budget of {budget / 2**20:.1f} MiB. '
            f'{fits} worker(s) would fit: {key} = dict(num_workers={fits}) '
            '(or a smaller prefetch_factor).')
        write_event(runner.work_dir, 'dataloader_memory', loader=name,
                    inflight_bytes=inflight, budget_bytes=budget,
                    workers=loader.num_workers, workers_that_fit=fits)
        if not self.cap_workers or fits >= loader.num_workers:
            log(message, logging.WARNING)
            return
        new_loader = lu.rebuild_loader(
            loader, num_workers=fits, prefetch_factor=loader.prefetch_factor,
            persistent_workers=loader.persistent_workers)
        self._check_leak(runner, name, lu.replace_loop_loader(loop,
                                                              new_loader))
        self._counts['capped'] += 1
        log(message + f' Capped to {fits} worker(s) (cap_workers=True).',
            logging.WARNING)
        update_counters('dataloader_probe', **{f'{name}_workers': fits})

    def _publish(self, name: str, result: str, seconds: float,
                 inflight: Optional[int]) -> None:
        fields = dict(self._counts)
        fields[name] = result
        fields[f'{name}_probe_s'] = round(seconds, 3)
        if inflight is not None:
            fields[f'{name}_inflight_mb'] = round(inflight / 2**20, 2)
        update_counters('dataloader_probe', **fields)

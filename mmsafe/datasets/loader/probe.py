"""Fetch a DataLoader's first batches through real worker processes.

Invariant: :func:`probe_fetch` leaves no worker process behind (it kills
the workers that do not answer and returns the pids it could not stop),
and it reads nothing through the real loader: the real loader's sampler,
iterator and the global random generators are untouched by it.
"""
import multiprocessing
import time
from typing import Any, Dict, List, Optional

import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from mmsafe.errors import MMSafeTimeoutError
from .processes import kill_processes, pid_alive, shutdown_iterator
from .rebuild import batch_size_of


def _probe_loader(loader: DataLoader, indices: List[int]) -> DataLoader:
    """A loader with ``loader``'s worker settings that reads ``indices``
    in order, with a generator of its own."""
    return DataLoader(
        loader.dataset, batch_size=batch_size_of(loader), sampler=indices,
        num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=torch.Generator().manual_seed(0),
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device)


def probe_fetch(loader: DataLoader, timeout: float,
                num_batches: Optional[int] = None,
                reset_round: Optional[bool] = None) -> Dict[str, Any]:
    """Fetch the first batches through real worker processes, with a
    deadline, then shut the workers down (killing them if they hang).

    The probe loader shares the dataset, collate_fn, worker_init_fn,
    start method, prefetch factor and persistent-workers setting of
    ``loader`` but reads the first ``batch_size x num_workers`` indices in
    order.

    Args:
        loader (DataLoader): the loader to probe (``num_workers > 0``).
        timeout (float): seconds for the whole probe.
        num_batches (int, optional): batches to fetch; one per worker by
            default, so every worker must deliver.
        reset_round (bool, optional): also restart a persistent iterator
            and fetch again, as the second epoch does. Defaults to
            ``loader.persistent_workers``.

    Returns:
        dict: ``ok`` (bool), ``error`` (str or None), ``timed_out``,
        ``seconds``, ``batch`` (the first batch, or None), ``worker_pids``,
        ``alive_after`` (pids still alive after cleanup; must be empty),
        ``exception`` (what a worker raised, for the caller to judge).
    """
    start = time.monotonic()
    deadline = start + timeout
    bs = batch_size_of(loader)
    n = len(loader.dataset)  # type: ignore[arg-type]
    if num_batches is None:
        num_batches = loader.num_workers
    num_batches = max(1, min(num_batches, -(-n // bs)))
    if reset_round is None:
        reset_round = bool(loader.persistent_workers)
    probe = _probe_loader(loader, list(range(min(n, bs * num_batches))))
    before = set(multiprocessing.active_children())
    result: Dict[str, Any] = dict(ok=False, error=None, timed_out=False,
                                  batch=None, worker_pids=[],
                                  alive_after=[], exception=None)
    late = f'no batch within the {timeout:g} s deadline'
    it = None
    try:
        for _ in range(2 if reset_round else 1):
            it = iter(probe)
            result['worker_pids'] = [
                w.pid for w in getattr(it, '_workers', [])]
            for _ in range(num_batches):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MMSafeTimeoutError
                # The iterator's per-batch wait; the sum stays within the
                # probe's deadline.
                it._timeout = remaining
                batch = next(it)
                if result['batch'] is None:
                    result['batch'] = batch
            if isinstance(it, _MultiProcessingDataLoaderIter):
                it._timeout = 0
        result['ok'] = True
    except (TimeoutError, StopIteration) as e:
        result['timed_out'] = isinstance(e, TimeoutError)
        result['error'] = late if result['timed_out'] else 'no batch'
    except RuntimeError as e:
        result['timed_out'] = 'timed out' in str(e)
        result['error'] = late if result['timed_out'] else \
            f'{type(e).__name__}: {e}'
        result['exception'] = None if result['timed_out'] else e
    except Exception as e:  # noqa: BLE001  returned for the caller to raise
        result['error'] = f'{type(e).__name__}: {e}'
        result['exception'] = e
    finally:
        alive: List[int] = []
        if it is not None:
            alive += shutdown_iterator(it, force=not result['ok'])
        probe._iterator = None
        # Workers of an iterator that failed half-way through its own
        # construction are not reachable through `it`.
        stray = [p for p in multiprocessing.active_children()
                 if p not in before]
        alive += kill_processes(stray)
        alive += [pid for pid in result['worker_pids']
                  if pid is not None and pid_alive(pid)]
        result['alive_after'] = sorted(set(alive))
        result['seconds'] = time.monotonic() - start
    return result

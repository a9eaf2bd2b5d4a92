"""Read a DataLoader's worker settings and rebuild it with other ones.

Invariant of :func:`rebuild_loader`: the new loader shares the dataset,
sampler, batch sampler, collate_fn, worker_init_fn and generator objects
with the old one (never copies), so per-epoch seeding (``set_epoch``) and
the position of infinite samplers carry over; only the worker settings
differ.
"""
import multiprocessing
from typing import Any, Dict, Optional

import torch
from torch.utils.data import DataLoader, IterableDataset


def start_method(loader: DataLoader) -> str:
    """The start method the loader's workers use."""
    ctx = loader.multiprocessing_context
    if ctx is None:
        return multiprocessing.get_start_method()
    return ctx.get_start_method()


def batch_size_of(loader: DataLoader) -> int:
    """Samples per batch, from the loader or its batch sampler."""
    if loader.batch_size is not None:
        return int(loader.batch_size)
    return int(getattr(loader.batch_sampler, 'batch_size', 1) or 1)


def is_iterable_dataset(loader: DataLoader) -> bool:
    """Whether the loader reads an ``IterableDataset`` (no indices)."""
    return isinstance(loader.dataset, IterableDataset)


def rebuild_loader(loader: DataLoader, num_workers: int,
                   prefetch_factor: Optional[int] = None,
                   persistent_workers: bool = False) -> DataLoader:
    """A new DataLoader on the same dataset, sampler, batch sampler,
    collate_fn and worker_init_fn, with other worker settings.

    Args:
        loader (DataLoader): the loader to rebuild.
        num_workers (int): workers of the new loader (0: main process).
        prefetch_factor (int, optional): for ``num_workers > 0``.
        persistent_workers (bool): for ``num_workers > 0``.

    Returns:
        DataLoader: the new loader (``loader`` is left as it is).
    """
    kwargs: Dict[str, Any] = dict(
        dataset=loader.dataset,
        num_workers=num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=loader.generator,
        pin_memory_device=loader.pin_memory_device)
    if hasattr(loader, 'in_order'):
        kwargs['in_order'] = loader.in_order
    if num_workers > 0:
        kwargs.update(
            multiprocessing_context=loader.multiprocessing_context,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers)
    auto_batch = (
        loader.batch_size is not None
        and type(loader.batch_sampler) is torch.utils.data.BatchSampler
        and loader.batch_sampler.sampler is loader.sampler)
    if auto_batch:
        # Keeps `loader.sampler` (DistSamplerSeedHook calls its set_epoch).
        kwargs.update(sampler=loader.sampler, batch_size=loader.batch_size,
                      drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs.update(batch_sampler=loader.batch_sampler)
    else:
        kwargs.update(sampler=loader.sampler, batch_size=None)
    return DataLoader(**kwargs)


def fetch_in_process(loader: DataLoader, batches: int = 1) -> Any:
    """Load the loader's first ``batches`` batches' samples without workers
    and return the first batch; an error of the dataset is raised as it is
    (a data bug must surface, not be hidden by a fallback)."""
    bs = batch_size_of(loader)
    n = len(loader.dataset)  # type: ignore[arg-type]
    plain = DataLoader(loader.dataset, batch_size=bs,
                       sampler=list(range(min(n, bs * batches))),
                       num_workers=0, collate_fn=loader.collate_fn)
    return next(iter(plain))

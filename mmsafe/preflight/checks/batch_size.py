"""Batch size and gradient accumulation give a positive per-step batch.

A batch size computed in a config (``max_img_per_gpu // sequence_length``,
``total // num_gpus``) can round to 0, or become a float with ``/``; both
only fail when the DataLoader is built or, worse, when a chunk of a batch
comes out empty (``1 // 4 == 0``).
"""
import re
from typing import Any, Iterator, Optional

from ..context import PreflightContext
from ..report import CheckRow

NAME = 'batch'
# Top-level variables that hold a per-device batch or a batch divisor.
_BATCH_VARS = re.compile(
    r'(batch_size|imgs?_per_gpu|samples_per_gpu|per_gpu|micro_batch)',
    re.IGNORECASE)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _why(value: Any) -> str:
    if isinstance(value, float):
        return (f'{value!r} is a float: a `/` division in the config (use '
                '`//`, and max(1, a // b) so it cannot round to 0)')
    if value == 0:
        return ('0: an integer division in the config probably rounded it '
                'down (e.g. max_img_per_gpu // sequence_length, or 1 // 4); '
                'use max(1, a // b)')
    return f'{value!r} is not a positive integer'


def _loader_batch(loader: dict) -> Any:
    if 'batch_size' in loader:
        return loader['batch_size']
    batch_sampler = loader.get('batch_sampler', None)
    if isinstance(batch_sampler, dict) and 'batch_size' in batch_sampler:
        return batch_sampler['batch_size']
    return 1  # torch's default


def _iters(ctx: PreflightContext, batch: int) -> Optional[int]:
    """Total training iterations, when the config and data tell."""
    train_cfg = ctx.cfg.get('train_cfg', None) or {}
    if _positive_int(train_cfg.get('max_iters', None)):
        return train_cfg['max_iters']
    length = ctx.state.get('dataset_len', {}).get('train_dataloader')
    epochs = train_cfg.get('max_epochs', None)
    if _positive_int(length) and _positive_int(epochs):
        per_rank = -(-length // ctx.world_size)
        return epochs * -(-per_rank // batch)
    return None


def check_batch_size(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Batch sizes are positive integers; accumulation keeps them so."""
    errors = 0
    train_batch = None
    for name, loader in ctx.dataloaders():
        batch = _loader_batch(loader)
        if not _positive_int(batch):
            errors += 1
            yield CheckRow(
                'error', NAME, f'{name} batch_size is {_why(batch)}.',
                f'{name}.batch_size', f'Set {name}.batch_size to an '
                'integer >= 1.')
        elif name == 'train_dataloader':
            train_batch = batch
    # Per-device / micro-batch variables that a config computes and passes
    # to its own code (they never reach the DataLoader checks above).
    for key in ctx.cfg.keys():
        value = ctx.cfg[key]
        if (_BATCH_VARS.search(key) and isinstance(value, (int, float))
                and not isinstance(value, bool) and not _positive_int(value)):
            errors += 1
            yield CheckRow('error', NAME, f'{key} is {_why(value)}.', key,
                           f'Make {key} an integer >= 1.')

    optim = ctx.cfg.get('optim_wrapper', None) or {}
    counts = optim.get('accumulative_counts', 1)
    if not _positive_int(counts):
        errors += 1
        yield CheckRow(
            'error', NAME, f'accumulative_counts is {_why(counts)}.',
            'optim_wrapper.accumulative_counts',
            'Use an integer >= 1 (1: no accumulation).')
        counts = None
    max_iters = _iters(ctx, train_batch) if train_batch else None
    if counts and counts > 1 and _positive_int(max_iters) and \
            counts > max_iters:
        errors += 1
        yield CheckRow(
            'error', NAME, f'accumulative_counts={counts} is more than the '
            f'{max_iters} training iterations of this run: the optimizer '
            'would step once, at the very end, on a partial accumulation.',
            'optim_wrapper.accumulative_counts',
            f'Use accumulative_counts <= {max_iters} (iterations = epochs x '
            'ceil(dataset / (batch_size x processes))).')
    if errors or train_batch is None:
        return
    step = train_batch * (counts or 1) * ctx.world_size
    yield CheckRow(
        'ok', NAME, f'{train_batch} samples per device x '
        f'{counts} accumulated x {ctx.world_size} process(es) = {step} '
        'samples per optimizer step.', 'train_dataloader.batch_size')

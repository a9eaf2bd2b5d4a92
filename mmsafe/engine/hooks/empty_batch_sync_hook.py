"""Keep DDP in step when a rank's batch has no valid ground truth."""
import logging
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict

from mmdet.registry import HOOKS
from mmsafe.dist import (StepConsensus, all_gather_object, all_reduce_sum,
                         get_rank, get_world_size, is_distributed, log_once)
from mmsafe.events import batch_file_names, log, update_counters, write_event

EMPTY_BATCH = 'empty_batch'


def _num_instances(sample: Any) -> Optional[int]:
    """Valid GT instances of one data sample, None when it has no GT."""
    gt = getattr(sample, 'gt_instances', None)
    if gt is None and isinstance(sample, dict):
        gt = sample.get('gt_instances')
    if gt is None:
        return None
    try:
        return len(gt)
    except (TypeError, AssertionError):
        # An InstanceData without fields has no length: nothing in it.
        return 0


def is_empty_batch(data_batch: Any) -> bool:
    """Whether no sample of the batch has a valid ground-truth instance.

    Batches whose samples carry no ``gt_instances`` at all (not a detection
    batch) are not called empty.
    """
    samples = data_batch.get('data_samples') if isinstance(
        data_batch, dict) else None
    if not samples:
        return False
    counts = [_num_instances(s) for s in samples]
    if any(c is None for c in counts):
        return False
    return sum(counts) == 0


@HOOKS.register_module()
class EmptyBatchSyncHook(Hook):
    """Make a batch without valid ground truth harmless under DDP.

    Incident: one rank's batch had no valid instances, its model returned a
    dummy loss early, some parameters got no gradient on that rank, and
    DDP's gradient all-reduce waited forever. With this hook:

    * ``before_train_iter`` checks, on every rank, whether the batch has any
      valid GT instance after the pipeline; an empty one is logged with
      rank, iteration and image paths, and appended to
      ``{work_dir}/mmsafe_events.jsonl`` (``kind='empty_batch'``);
    * a forward hook on the unwrapped model keeps that rank's loss connected
      to every trainable parameter: a graph-connected zero
      (``sum(p.sum() for p in params) * 0``) is added to the loss, loss
      values that are constants become connected, and loss keys that the
      model dropped are filled with the connected zero, so every rank has
      the same keys (learned from earlier steps; on the first training step
      the ranks exchange their key sets once). DDP then never hangs or
      errors with ``find_unused_parameters=False``, whatever the model's
      loss does on empty input;
    * the rank posts ``empty_batch`` to :class:`mmsafe.dist.StepConsensus`;
      mmsafe's optim wrappers skip the step on all ranks when every rank's
      batch (every micro-batch of an accumulation window) was empty, so a
      step without signal causes no momentum or weight-decay drift.

    With an optim wrapper that is not mmsafe's, the hook warns once and
    all-reduces its own flag in ``before_train_iter`` (one collective, on
    every rank); when all ranks are empty it suppresses that iteration's
    optimizer step (only without gradient accumulation).

    Args:
        skip_all_empty (bool): skip the optimizer step when every rank's
            batch is empty. Defaults to True.
        always_connect (bool): add the connected zero on every training
            step, not only on empty batches (for models that drop
            parameters on other inputs too). Defaults to False.
    """

    priority = 'NORMAL'

    def __init__(self, skip_all_empty: bool = True,
                 always_connect: bool = False) -> None:
        self.skip_all_empty = skip_all_empty
        self.always_connect = always_connect
        StepConsensus.get().declare(
            EMPTY_BATCH, skip_when='all' if skip_all_empty else None)
        self._empty = False
        # Only the forward of a training iteration is touched (set between
        # before_train_iter and after_train_iter): a loss forward that some
        # other hook runs elsewhere, maybe on one rank only, must neither be
        # changed nor start the one-time key exchange (a collective).
        self._in_train_iter = False
        self._files: List[str] = []
        self._loss_keys: set = set()
        self._keys_exchanged = False
        self._handle = None
        self._managed = False
        self._suppressed: List[Any] = []
        self._reduces_before = 0
        self._all_empty_local = False
        self.counters: Dict[str, int] = dict(empty_batches=0,
                                             all_empty_iters=0)

    # ------------------------------------------------------------------ #
    def before_train(self, runner) -> None:
        """Hook the model's forward and find out who reduces the flags."""
        from mmsafe.engine.optimizers import NaNSkipOptimWrapper
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        if self._handle is None:
            self._handle = model.register_forward_hook(
                self._connect_losses, with_kwargs=True)
        self._managed = isinstance(runner.optim_wrapper, NaNSkipOptimWrapper)
        if not self._managed:
            log_once(
                'empty_batch_unmanaged',
                '[mmsafe] EmptyBatchSyncHook: the optim wrapper '
                f'{type(runner.optim_wrapper).__name__} is not an mmsafe '
                'one, so the hook all-reduces its own empty-batch flag every '
                'iteration (an extra collective) and can only suppress an '
                'all-ranks-empty step without gradient accumulation; NaN '
                'losses are not guarded. Set '
                "optim_wrapper=dict(type='NaNSkipOptimWrapper', ...) (or "
                "'AmpNaNSkipOptimWrapper') to fold this into the step's "
                'single consensus.', logging.WARNING)

    def after_train(self, runner) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch: Optional[dict] = None) -> None:
        """Detect an empty batch, report it, and post (or reduce) the flag."""
        empty = is_empty_batch(data_batch)
        self._empty = empty
        self._in_train_iter = True
        self._files = batch_file_names(data_batch) if empty else []
        if empty:
            self.counters['empty_batches'] += 1
            log(f'rank {get_rank()}: the batch of Iter(train) '
                f'{runner.iter + 1} has no valid ground-truth instance; its '
                'loss is kept connected to every parameter. '
                f'files={self._files}', logging.WARNING)
            write_event(runner.work_dir, 'empty_batch', iter=runner.iter,
                        files=self._files)
        if self._managed:
            consensus = StepConsensus.get()
            consensus.post(EMPTY_BATCH, 1.0 if empty else 0.0)
            self._reduces_before = consensus.num_reduces
            return
        # Not mmsafe's optim wrapper: reduce our own flag, on every rank.
        num_empty = all_reduce_sum([1.0 if empty else 0.0])[0]
        world_size = get_world_size() if is_distributed() else 1
        self._report(runner, int(num_empty), world_size)
        if num_empty == world_size and self.skip_all_empty:
            self._suppress_step(runner)

    def after_train_iter(self, runner, batch_idx: int,
                         data_batch: Optional[dict] = None,
                         outputs: Optional[dict] = None) -> None:
        """Restore a suppressed step; report what the consensus saw."""
        self._in_train_iter = False
        for wrapper in self._suppressed:
            wrapper.__dict__.pop('step', None)
        self._suppressed = []
        if self._managed:
            consensus = StepConsensus.get()
            if consensus.num_reduces != self._reduces_before:
                self._report(runner, int(consensus.last(EMPTY_BATCH)),
                             consensus.last_count(EMPTY_BATCH))
        update_counters('empty_batch', **self.counters)

    # ------------------------------------------------------------------ #
    def _report(self, runner, num_empty: int, num_batches: int) -> None:
        if num_empty == 0:
            return
        if num_empty >= num_batches:
            self.counters['all_empty_iters'] += 1
        log(f'{num_empty} of {num_batches} batches (all ranks) of the step '
            f'ending at Iter(train) {runner.iter + 1} had no valid ground '
            'truth'
            + ('; the optimizer step is skipped on all ranks'
               if num_empty >= num_batches and self.skip_all_empty else '')
            + '. Files per rank: mmsafe_events.jsonl (kind=empty_batch).',
            logging.WARNING)

    def _suppress_step(self, runner) -> None:
        wrapper = runner.optim_wrapper
        wrappers = list(wrapper.values()) if isinstance(
            wrapper, OptimWrapperDict) else [wrapper]
        if any(getattr(w, '_accumulative_counts', 1) != 1 for w in wrappers):
            log_once(
                'empty_batch_accumulation',
                '[mmsafe] EmptyBatchSyncHook cannot skip an all-empty step '
                'with gradient accumulation and a non-mmsafe optim wrapper; '
                "use optim_wrapper=dict(type='NaNSkipOptimWrapper', ...).",
                logging.WARNING)
            return

        def no_step(**kwargs) -> None:
            return None

        for w in wrappers:
            # Shadows OptimWrapper.step for this one iteration only;
            # zero_grad still runs, so no stale gradient survives.
            w.step = no_step
        self._suppressed = wrappers

    # ------------------------------------------------------------------ #
    def _connect_losses(self, module: nn.Module, args: Sequence,
                        kwargs: dict, output: Any) -> Any:
        mode = kwargs.get('mode', args[2] if len(args) > 2 else None)
        if (not self._in_train_iter or mode != 'loss' or not module.training
                or not isinstance(output, dict)):
            return None
        if not self._keys_exchanged:
            # First training forward on every rank: one exchange of the loss
            # keys, so that a rank whose very first batch is empty still
            # knows the keys the others produce.
            self._keys_exchanged = True
            for keys in all_gather_object(sorted(output.keys())):
                self._loss_keys.update(keys)
        if self._empty or self.always_connect:
            output = self._fill(module, dict(output))
        self._loss_keys.update(output.keys())
        return output

    def _fill(self, module: nn.Module, losses: dict) -> dict:
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            return losses
        zero = torch.stack([p.sum().float() for p in params]).sum() * 0.0
        for key in sorted(self._loss_keys - set(losses)):
            losses[key] = zero
        loss_keys = [k for k in sorted(losses) if 'loss' in k]
        for key in loss_keys:
            losses[key] = _connect(losses[key], zero)
        if loss_keys:
            first = loss_keys[0]
            value = losses[first]
            if isinstance(value, torch.Tensor):
                losses[first] = value + zero
            elif isinstance(value, (list, tuple)) and value:
                losses[first] = [value[0] + zero, *value[1:]]
        return losses


def _connect(value: Any, zero: torch.Tensor) -> Any:
    """Make constant (graph-less) loss tensors part of the graph."""
    if isinstance(value, torch.Tensor):
        return value if value.requires_grad else value + zero
    if isinstance(value, (list, tuple)):
        return [_connect(v, zero) for v in value]
    return value

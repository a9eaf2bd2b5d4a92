"""Keep DDP in step when a rank's batch has no valid ground truth."""
import logging
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn as nn
from mmengine.hooks import Hook

from mmsafe.registry import HOOKS
from mmsafe.dist import get_rank, get_world_size, is_distributed
from mmsafe.engine.guard_status import ACTIVE, INACTIVE
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.engine.optimizers import NaNSkipOptimWrapper
from mmsafe.engine.loss_graph import loss_keys
from mmsafe.engine.utils import unwrap_model
from mmsafe.errors import MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import batch_file_names, log, update_counters, write_event

# The monitor-sync name of this hook, and the skip reason it gives the
# optimizer wrapper.
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


def carries_ground_truth(data_batch: Any) -> bool:
    """Whether every data sample of the batch carries ``gt_instances``
    (a detection batch, which can be told empty)."""
    samples = data_batch.get('data_samples') if isinstance(
        data_batch, dict) else None
    return bool(samples) and all(_num_instances(s) is not None
                                 for s in samples)


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
    """Make a batch without valid ground truth harmless under DDP, and
    report it.

    Without it, a model that returns early on a batch without valid
    instances leaves some parameters without a gradient on that rank, and
    DDP's gradient all-reduce waits for them forever (or fails with
    ``find_unused_parameters=False``). With this hook:

    * ``before_train_iter`` checks, on every rank, whether the batch has any
      valid GT instance after the pipeline; an empty one is logged with
      rank, iteration and image paths, and appended to
      ``{work_dir}/mmsafe_events.jsonl`` (``kind='empty_batch'``);
    * a forward hook on the unwrapped model keeps that rank's loss connected
      to every trainable parameter: a graph-connected zero
      (``sum(p.sum() for p in params) * 0``) is added to the loss, loss
      values that are constants become connected, and loss keys that the
      model dropped (known from this rank's earlier iterations) are filled
      with the connected zero. DDP then never hangs or errors with
      ``find_unused_parameters=False``, whatever the model's loss does on
      empty input. Adding an exact zero changes no loss value and no
      gradient;
    * the batch otherwise trains as MMEngine would train it: background is
      signal for the RPN, the RoI head and MACL. A step that carries no
      signal at all (zero gradient on every rank) is skipped by mmsafe's
      optim wrappers on their own;
    * the count of empty batches over all ranks travels with mmsafe's other
      monitoring values at the log interval (:class:`MonitorSync`): no
      collective on an ordinary iteration.

    Args:
        skip_all_empty (bool): opt in to skipping the optimizer step when
            every rank's batch (every iteration of an accumulation window)
            is empty. It costs one all-reduce of the empty flags per
            iteration and needs ``NaNSkipOptimWrapper`` or
            ``AmpNaNSkipOptimWrapper``. Defaults to False.
        always_connect (bool): add the connected zero on every training
            step, not only on empty batches (for models that drop
            parameters on other inputs too). Defaults to False.
    """

    guard_outputs = GuardOutputs(
        Section.EMPTY_BATCHES,
        events=(Event.EMPTY_BATCH, ),
        counters=(CounterKey.EMPTY_BATCH, ))

    priority = 'NORMAL'

    def __init__(self, skip_all_empty: bool = False,
                 always_connect: bool = False) -> None:
        self.skip_all_empty = skip_all_empty
        self.always_connect = always_connect
        self._sync = None
        self._empty = False
        # Only the forward of a training iteration is touched (set between
        # before_train_iter and after_train_iter): a loss forward that some
        # other hook runs elsewhere must not be changed.
        self._in_train_iter = False
        self._files: List[str] = []
        self._loss_keys: set = set()
        self._handle = None
        self.counters: Dict[str, int] = dict(empty_batches=0,
                                             all_empty_iters=0)
        # whether the batches carry gt_instances (None: none seen yet)
        self._detection: Optional[bool] = None

    # ------------------------------------------------------------------ #
    def before_run(self, runner) -> None:
        self._sync = monitor_sync_of(runner)
        self._sync.declare(EMPTY_BATCH)

    def before_train(self, runner) -> None:
        """Hook the model's forward; check the opt-in's requirement."""
        if self.skip_all_empty and not isinstance(runner.optim_wrapper,
                                                  NaNSkipOptimWrapper):
            raise MMSafeValueError(
                '[mmsafe] EmptyBatchSyncHook(skip_all_empty=True) needs '
                "optim_wrapper=dict(type='NaNSkipOptimWrapper', ...) (or "
                "'AmpNaNSkipOptimWrapper'), which can skip a step; got "
                f'{type(runner.optim_wrapper).__name__}. Switch the optim '
                'wrapper or drop skip_all_empty.')
        model = unwrap_model(runner.model)
        if self._handle is None:
            self._handle = model.register_forward_hook(
                self._connect_losses, with_kwargs=True)

    def after_train(self, runner) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch: Optional[dict] = None) -> None:
        """Detect an empty batch, report it, and post the count."""
        empty = is_empty_batch(data_batch)
        if self._detection is None:
            self._detection = carries_ground_truth(data_batch)
            if not self._detection:
                log('EmptyBatchSyncHook: the data samples carry no '
                    'gt_instances, so a batch without ground truth cannot '
                    'be told; set always_connect=True to keep every '
                    'parameter in the graph on every step anyway',
                    logging.WARNING)
        self._empty = empty
        self._in_train_iter = True
        self._files = batch_file_names(data_batch) if empty else []
        if empty:
            self.counters['empty_batches'] += 1
            message = (f'rank {get_rank()}: the batch of Iter(train) '
                       f'{runner.iter + 1} has no valid ground-truth '
                       'instance; it trains on background, its loss kept '
                       f'connected to every parameter. files={self._files}')
            write_event(runner.work_dir, Event.EMPTY_BATCH, message,
                        logging.INFO, iter=runner.iter, files=self._files)
        self._sync.post(EMPTY_BATCH, 1.0 if empty else 0.0)
        if self.skip_all_empty:
            # The opt-in's own collective, on every rank, every iteration.
            num_empty = self._sync.sum_now(1.0 if empty else 0.0)
            world_size = get_world_size() if is_distributed() else 1
            if num_empty == world_size:
                self.counters['all_empty_iters'] += 1
                runner.optim_wrapper.request_skip(EMPTY_BATCH)

    def after_train_iter(self, runner, batch_idx: int,
                         data_batch: Optional[dict] = None,
                         outputs: Optional[dict] = None) -> None:
        """Report the empty batches of all ranks at the log interval."""
        self._in_train_iter = False
        sync = self._sync
        if sync.sync(runner):
            num_empty = int(sync.last(EMPTY_BATCH))
            if num_empty:
                log(f'{num_empty} of the last {sync.last_count(EMPTY_BATCH)} '
                    'batches (all ranks), up to Iter(train) '
                    f'{runner.iter + 1}, had no valid ground truth; they '
                    'trained on background. Files per rank: '
                    'mmsafe_events.jsonl (kind=empty_batch).',
                    logging.INFO)
        update_counters(CounterKey.EMPTY_BATCH, **self.counters)

    def guard_status(self, runner) -> dict:
        """Active on detection batches (``gt_instances`` in the data
        samples), or with ``always_connect``."""
        if self._detection is False and not self.always_connect:
            return dict(status=INACTIVE, detail='the data samples carry no '
                        'gt_instances; set always_connect=True')
        return dict(status=ACTIVE, detail=f"{self.counters['empty_batches']}"
                    ' empty batch(es) on this rank')

    # ------------------------------------------------------------------ #
    def _connect_losses(self, module: nn.Module, args: Sequence,
                        kwargs: dict, output: Any) -> Any:
        mode = kwargs.get('mode', args[2] if len(args) > 2 else None)
        if (not self._in_train_iter or mode != 'loss' or not module.training
                or not isinstance(output, dict)):
            return None
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
        summed = loss_keys(losses)
        for key in summed:
            losses[key] = _connect(losses[key], zero)
        if summed:
            first = summed[0]
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

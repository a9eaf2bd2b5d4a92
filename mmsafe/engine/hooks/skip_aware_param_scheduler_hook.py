"""A ParamSchedulerHook that holds iteration-based schedules on skipped
optimizer steps."""
from typing import Optional

from mmengine.hooks import ParamSchedulerHook

from mmsafe.registry import HOOKS
from mmsafe.guard_outputs import CounterKey, GuardOutputs, Section
from mmsafe.events import log, update_counters


@HOOKS.register_module()
class SkipAwareParamSchedulerHook(ParamSchedulerHook):
    """MMEngine's ``ParamSchedulerHook``, except that iteration-based
    schedules (warmup included) do not advance for optimizer steps that
    mmsafe's optim wrappers skipped, as DeepSpeed and Megatron-LM do.

    By default MMEngine steps every iteration-based scheduler after every
    training iteration, whether or not the optimizer stepped, so a run with
    k skipped steps ends its schedule having applied k fewer updates. With
    this hook the schedule counts applied updates instead: when a step is
    skipped, the schedulers are held for the iterations of that step's
    accumulation window (``accumulative_counts``), the skipped iteration
    first. Epoch-based schedules are unchanged. Use it in place of the
    default hook::

        default_hooks = dict(
            param_scheduler=dict(type='SkipAwareParamSchedulerHook'))

    With an optim wrapper that never skips (not mmsafe's) it behaves exactly
    like ``ParamSchedulerHook``.
    """

    guard_outputs = GuardOutputs(
        Section.OTHER,
        counters=(CounterKey.PARAM_SCHEDULER, ))

    def __init__(self) -> None:
        self._skipped_seen = 0
        self._hold = 0
        self.held_iters = 0

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        """Step the iteration-based schedulers, or hold them for a
        skipped step."""
        wrapper = runner.optim_wrapper
        # NaNSkipOptimWrapper's public counts; other wrappers never skip
        skipped = int(getattr(wrapper, 'skipped_steps', 0))
        if skipped > self._skipped_seen:
            window = int(getattr(wrapper, 'accumulation_window', 1))
            self._hold += (skipped - self._skipped_seen) * window
        self._skipped_seen = skipped
        if self._hold > 0:
            self._hold -= 1
            self.held_iters += 1
            if self.held_iters == 1:
                log('SkipAwareParamSchedulerHook: the learning-rate schedule '
                    f'is held at Iter(train) {runner.iter + 1} because the '
                    'optimizer step was skipped; it advances with applied '
                    'updates only (held iterations: mmsafe/param_scheduler '
                    'in the message hub).')
            update_counters(CounterKey.PARAM_SCHEDULER,
                            held_iters=self.held_iters)
            return
        super().after_train_iter(runner, batch_idx, data_batch, outputs)

"""SkipAwareParamSchedulerHook: the learning-rate schedule advances with
applied optimizer steps only; without skips it is ParamSchedulerHook."""
from types import SimpleNamespace

import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.hooks import ParamSchedulerHook
from mmengine.logging import MessageHub
from mmengine.optim import LinearLR

from mmsafe.engine.hooks import SkipAwareParamSchedulerHook
from mmsafe.engine.optimizers import NaNSkipOptimWrapper
from tests.engine.step_toys import StepToyDataset, StepToyDetector


@pytest.fixture(autouse=True)
def fresh_state():
    hub = MessageHub.get_instance('test_skip_aware_scheduler')
    yield hub


def lrs(hook, nan_iters, iters=8, accumulative_counts=1):
    data = StepToyDataset(
        num_samples=2 * iters,
        faults=[(2 * it, 'nan_loss') for it in nan_iters])
    torch.manual_seed(0)
    model = StepToyDetector()
    wrapper = NaNSkipOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        accumulative_counts=accumulative_counts)
    scheduler = LinearLR(wrapper, start_factor=0.1, by_epoch=False, begin=0,
                         end=6)
    runner = SimpleNamespace(optim_wrapper=wrapper,
                             param_schedulers=[scheduler], iter=0)
    hub = MessageHub.get_current_instance()
    wrapper.initialize_count_status(model, 0, iters)
    seen = []
    for it in range(iters):
        runner.iter = it
        hub.update_info('iter', it)
        model.train_step(pseudo_collate([data[2 * it], data[2 * it + 1]]),
                         wrapper)
        hook.after_train_iter(runner, it)
        seen.append(wrapper.optimizer.param_groups[0]['lr'])
    return seen, wrapper


def test_schedule_is_held_on_a_skipped_step():
    default, _ = lrs(ParamSchedulerHook(), nan_iters=[2])
    healthy, _ = lrs(SkipAwareParamSchedulerHook(), nan_iters=[])
    held, wrapper = lrs(SkipAwareParamSchedulerHook(), nan_iters=[2])
    assert wrapper.counters['skipped'] == 1
    # Without skips it is MMEngine's hook.
    assert healthy == default
    # The skipped iteration 2 does not advance the schedule: every later
    # value comes one iteration late.
    assert held[:2] == default[:2]
    assert held[2] == held[1]
    assert held[3:] == default[2:-1]


def test_a_dropped_accumulation_window_holds_all_its_iterations():
    default, _ = lrs(ParamSchedulerHook(), nan_iters=[2],
                     accumulative_counts=2)
    held, wrapper = lrs(SkipAwareParamSchedulerHook(), nan_iters=[2],
                        accumulative_counts=2)
    assert wrapper.counters['skipped'] == 1  # the window of iterations 2-3
    assert held[:3] == default[:3]
    assert held[3] == held[2] and held[4] == held[2]
    assert held[5:] == default[3:-2]

"""Spike skip of the NaN-skip wrappers (single process, MMEngine's real
``train_step`` on the step toys): the rule, warm-up, an unpolluted window,
the skip itself, what it names, checkpoints and the rollback's rewind.

The fault is an out-of-range image: the toy's backbone is a linear layer
on the pixels, so an image 1000x its usual range makes a gradient about
1000x the usual norm (finite: the NaN guard does not see it).
"""
import math
import re

import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.logging import MessageHub

from mmsafe.engine.optimizers import (AmpNaNSkipOptimWrapper,
                                      NaNSkipOptimWrapper)
from mmsafe.engine.optimizers.grad_spike import GradSpikeDetector
from mmsafe.engine.optimizers.nan_skip_optim_wrapper import \
    use_run_spike_skip
from mmsafe.events import read_events
from tests.engine.step_toys import StepToyDataset, StepToyDetector
from tests.utils import logged_messages

WINDOW = 6


@pytest.fixture(autouse=True)
def hub():
    hub = MessageHub.get_instance('test_grad_spike')
    hub.update_info('iter', 0)
    yield hub


def make(wrapper_cls=NaNSkipOptimWrapper, **kw):
    torch.manual_seed(0)
    model = StepToyDetector()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                                weight_decay=0.01)
    if wrapper_cls is AmpNaNSkipOptimWrapper:
        kw.setdefault('device_type', 'cpu')
    return model, wrapper_cls(optimizer=optimizer, **kw)


def batch(data, first, scale=1.0):
    out = pseudo_collate([data[first], data[first + 1]])
    out['inputs'][0] = out['inputs'][0] * scale
    return out


def params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def train(model, wrapper, hub, data, iters, start=0):
    for it in range(start, start + iters):
        hub.update_info('iter', it)
        model.train_step(batch(data, 2 * it), wrapper)


# --------------------------------------------------------------- rule --
def test_rule_waits_for_a_full_window_and_needs_both_tests():
    det = GradSpikeDetector(window=4, sigmas=6, min_ratio=2)
    for v in (1.0, 1.1, 0.9):
        det.accept(v)
    assert det.judge(100.0) is None  # warm-up: 3 of 4 steps
    det.accept(1.0)
    stats = det.statistics()
    assert stats['mean'] == pytest.approx(1.0)
    assert stats['std'] == pytest.approx(math.sqrt(0.02 / 3))
    # 6 std above is 1.49; the ratio floor 2x the mean decides
    assert stats['threshold'] == pytest.approx(2.0)
    assert det.judge(1.9) is None
    verdict = det.judge(2.5)
    assert verdict['ratio'] == pytest.approx(2.5)
    assert verdict['sigmas_above'] == pytest.approx(1.5 / stats['std'])
    wide = GradSpikeDetector(window=4, sigmas=6, min_ratio=1)
    for v in (1.0, 3.0, 1.0, 3.0):
        wide.accept(v)
    # mean 2, std 1.15: 6 std (8.9) decides over the floor
    assert wide.judge(8.0) is None and wide.judge(9.0) is not None


@pytest.mark.parametrize('cfg', [dict(window=1), dict(sigmas=0),
                                 dict(min_ratio=0.5), dict(sigma=6)])
def test_bad_settings_are_refused(cfg):
    with pytest.raises(ValueError):
        GradSpikeDetector.from_config(cfg)


# ------------------------------------------------------------ wrapper --
def test_spike_is_skipped_named_and_kept_out_of_the_window(hub, tmp_path):
    data = StepToyDataset(num_samples=64)
    model, wrapper = make(spike_skip=dict(window=WINDOW))
    wrapper.bind_work_dir(str(tmp_path))
    train(model, wrapper, hub, data, WINDOW)
    window = list(wrapper.spike_detector.norms)
    assert len(window) == WINDOW and wrapper.counters['skipped'] == 0
    before = params(model)
    momentum = {k: wrapper.optimizer.state[p]['momentum_buffer'].clone()
                for k, p in model.named_parameters()}

    hub.update_info('iter', WINDOW)
    with logged_messages() as messages:
        model.train_step(batch(data, 2 * WINDOW, scale=1000.0), wrapper)
    # skipped on this (the only) rank: nothing moved, grads zeroed
    assert all(torch.equal(before[k], v) for k, v in params(model).items())
    for k, p in model.named_parameters():
        assert torch.equal(wrapper.optimizer.state[p]['momentum_buffer'],
                           momentum[k])
        assert p.grad is None or not p.grad.any()
    c = wrapper.counters
    assert (c['skipped'], c['spike_skips'], c['nan_skips']) == (1, 1, 0)
    assert c['by_reason'] == {'grad_spike': 1}
    assert hub.get_scalar('train/spike_skips').current() == 1
    # the spike never entered the window
    assert list(wrapper.spike_detector.norms) == window
    text = '\n'.join(messages)
    assert f'Iter(train) {WINDOW + 1}' in text and 'grad_spike' in text
    assert f'of the last {WINDOW} applied steps' in text
    spike = [b for b in wrapper.recent_bad][-1]
    files = spike['files'][0]
    assert files == [f'toy/vis/{i:04d}.png | toy/ir/{i:04d}.png'
                     for i in (2 * WINDOW, 2 * WINDOW + 1)]
    # each image named with its range as loaded and its annotations
    first = [line for line in messages[-1].splitlines()
             if 'rank 0 image: ' + files[0] in line]
    assert len(first) == 1 and '1 boxes' in first[0], messages[-1]
    assert 'classes [' in first[0]
    low, high = re.search(r'image ([-\d.e+]+)\.\.([-\d.e+]+)\)',
                          first[0]).groups()
    assert float(high) > 500  # the out-of-range image, as loaded
    event, = read_events(str(tmp_path), 'step_skip')
    assert event['reasons'] == ['grad_spike'] and event['iter'] == WINDOW
    assert event['spike']['steps'] == WINDOW
    event_images = event['images']
    assert [e['file'] for e in event_images] == files
    assert event_images[1]['range']['image'][1] <= 1.0

    # the next healthy step is applied and enters the window
    train(model, wrapper, hub, data, 1, start=WINDOW + 1)
    assert wrapper.counters['consecutive'] == 0
    assert len(wrapper.spike_detector.norms) == WINDOW
    assert list(wrapper.spike_detector.norms)[:-1] == window[1:]


def test_off_by_default_the_spike_is_applied(hub):
    data = StepToyDataset(num_samples=64)
    model, wrapper = make()
    assert wrapper.spike_detector is None
    train(model, wrapper, hub, data, WINDOW)
    before = params(model)
    model.train_step(batch(data, 2 * WINDOW, scale=1000.0), wrapper)
    assert not all(torch.equal(before[k], v)
                   for k, v in params(model).items())
    assert wrapper.counters['skipped'] == 0


def test_a_healthy_run_is_the_same_with_and_without_it(hub):
    data = StepToyDataset(num_samples=64)
    runs = []
    for spike_skip in (None, dict(window=4)):
        model, wrapper = make(spike_skip=spike_skip)
        train(model, wrapper, hub, data, 24)
        assert wrapper.counters['skipped'] == 0
        runs.append(params(model))
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_the_runs_setting_applies_unless_the_wrapper_decides():
    _, plain = make()
    _, explicit_off = make(spike_skip=False)
    _, explicit_on = make(spike_skip=dict(window=9))
    for wrapper in (plain, explicit_off, explicit_on):
        use_run_spike_skip(wrapper, dict(window=5, sigmas=4))
    assert plain.spike_detector.window == 5
    assert plain.spike_detector.sigmas == 4
    assert plain.spike_skip_source == 'run'
    assert explicit_off.spike_detector is None
    assert explicit_on.spike_detector.window == 9
    # taken once: a second build keeps the window it holds
    plain.spike_detector.accept(1.0)
    use_run_spike_skip(plain, dict(window=5))
    assert list(plain.spike_detector.norms) == [1.0]


def test_window_survives_checkpoints_and_rewind_keeps_counters(hub, tmp_path):
    data = StepToyDataset(num_samples=64)
    model, wrapper = make(spike_skip=dict(window=4))
    train(model, wrapper, hub, data, 4)
    path = tmp_path / 'optim.pth'
    torch.save(wrapper.state_dict(), path)
    state = torch.load(path, weights_only=True)
    _, restored = make(spike_skip=dict(window=4))
    restored.load_state_dict(state)
    assert list(restored.spike_detector.norms) == \
        list(wrapper.spike_detector.norms)

    hub.update_info('iter', 4)
    model.train_step(batch(data, 8, scale=1000.0), wrapper)  # spike
    assert wrapper.counters['consecutive'] == 1
    wrapper.rewind(state)
    # the optimizer went back, the skips stay counted
    assert wrapper.counters['spike_skips'] == 1
    assert wrapper.counters['skipped'] == 1
    assert wrapper.counters['consecutive'] == 0
    assert wrapper.unstable_skips == 1


def test_amp_spike_skip_keeps_the_scaler_legal(hub):
    data = StepToyDataset(num_samples=64)
    model, wrapper = make(AmpNaNSkipOptimWrapper, dtype='bfloat16',
                          spike_skip=dict(window=4))
    train(model, wrapper, hub, data, 4)
    before = params(model)
    hub.update_info('iter', 4)
    model.train_step(batch(data, 8, scale=1000.0), wrapper)
    assert all(torch.equal(before[k], v) for k, v in params(model).items())
    assert wrapper.counters['spike_skips'] == 1
    train(model, wrapper, hub, data, 2, start=5)  # scaler still legal
    assert wrapper.counters['steps'] == 6

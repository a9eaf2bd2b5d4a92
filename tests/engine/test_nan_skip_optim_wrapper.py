"""NaNSkipOptimWrapper / AmpNaNSkipOptimWrapper.

Single-process tests drive the wrappers through MMEngine's real
``train_step``; the 2-process gloo tests run ``tools/train.py`` with a real
Runner and inject faults by rank and iteration (tests/engine/step_toys.py).
"""
import math
import os.path as osp
import shutil

import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.logging import MessageHub

from mmsafe.engine.optimizers import (AmpNaNSkipOptimWrapper,
                                      NaNSkipOptimWrapper)
from mmsafe.events import read_events
from tests.engine import step_toys_runs as runs
from tests.engine.step_toys import StepToyDataset, StepToyDetector
from tests.utils import cpu_and_cuda, skip_without_autocast


@pytest.fixture(autouse=True)
def fresh_state():
    hub = MessageHub.get_instance('test_nan_skip')
    hub.update_info('iter', 0)
    yield hub


def batch(dataset, *indices):
    return pseudo_collate([dataset[i] for i in indices])


def make(wrapper_cls=NaNSkipOptimWrapper, momentum=0.9, lr=0.05,
         device='cpu', **kw):
    torch.manual_seed(0)
    model = StepToyDetector().to(device)
    if wrapper_cls is AmpNaNSkipOptimWrapper:
        kw.setdefault('device_type', device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                                weight_decay=0.01)
    return model, wrapper_cls(optimizer=optimizer, **kw)


def params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------- #
# single process, real train_step
def test_nan_loss_skips_without_touching_params_or_momentum(fresh_state):
    data = StepToyDataset(faults=[(2, 'nan_loss')])
    model, wrapper = make()
    model.train_step(batch(data, 0, 1), wrapper)
    before = params(model)
    momentum = {id(p): wrapper.optimizer.state[p]['momentum_buffer'].clone()
                for p in model.parameters()}
    norms_before = list(fresh_state.get_scalar('train/grad_norm').data[0])

    fresh_state.update_info('iter', 1)
    model.train_step(batch(data, 2, 3), wrapper)
    assert same(before, params(model))
    for p in model.parameters():
        assert torch.equal(wrapper.optimizer.state[p]['momentum_buffer'],
                           momentum[id(p)])
        assert p.grad is None or not p.grad.any()
    assert wrapper.counters['skipped'] == 1
    assert wrapper.counters['nan_skips'] == 1
    assert wrapper.counters['consecutive'] == 1
    # The non-finite norm never reaches the logged grad_norm.
    norms = list(fresh_state.get_scalar('train/grad_norm').data[0])
    assert norms == norms_before and all(map(math.isfinite, norms))
    assert fresh_state.get_scalar('train/nan_skips').current() == 1

    fresh_state.update_info('iter', 2)
    model.train_step(batch(data, 4, 5), wrapper)
    assert not same(before, params(model))
    assert wrapper.counters['consecutive'] == 0
    assert wrapper.counters['steps'] == 2


def test_max_consecutive_skips_names_iterations_and_files(fresh_state):
    data = StepToyDataset(faults=[(i, 'nan_loss') for i in range(6)])
    model, wrapper = make(max_consecutive_skips=3)
    for it in range(2):
        fresh_state.update_info('iter', it)
        model.train_step(batch(data, 2 * it, 2 * it + 1), wrapper)
    fresh_state.update_info('iter', 2)
    with pytest.raises(RuntimeError) as err:
        model.train_step(batch(data, 4, 5), wrapper)
    message = str(err.value)
    assert '3 optimizer steps in a row were skipped' in message
    for it, index in ((1, 0), (2, 2), (3, 4)):
        assert f'Iter(train) {it} (nonfinite_' in message
        assert f'toy/vis/{index:04d}.png' in message


def test_counters_survive_state_dict_and_weights_only_load(tmp_path):
    data = StepToyDataset(faults=[(0, 'nan_loss')])
    model, wrapper = make()
    model.train_step(batch(data, 0, 1), wrapper)
    path = tmp_path / 'optim.pth'
    torch.save(wrapper.state_dict(), path)
    state = torch.load(path, weights_only=True)
    _, restored = make()
    restored.load_state_dict(state)
    assert restored.counters == wrapper.counters
    assert restored.counters['nan_skips'] == 1
    assert [b['iter'] for b in restored.recent_bad] == [0]


def test_per_module_clipping_and_global_norm(fresh_state):
    data = StepToyDataset()
    model, wrapper = make(
        momentum=0.0, lr=1.0,
        clip_grad_per_module=[dict(pattern='bbox_head', max_norm=1e-3)],
        clip_grad=dict(max_norm=100.0))
    before = params(model)
    model.train_step(batch(data, 0, 1), wrapper)
    after = params(model)
    # SGD with lr=1 and no momentum: the update is -grad (- weight decay).
    def update_norm(prefix):
        return torch.linalg.vector_norm(torch.cat([
            (before[k] - after[k] - 0.01 * before[k]).flatten()
            for k in before if k.startswith(prefix)]))
    assert update_norm('bbox_head') <= 1e-3 * 1.01
    assert update_norm('backbone') > 1e-2
    group_norm = fresh_state.get_scalar('train/grad_norm_bbox_head').current()
    global_norm = fresh_state.get_scalar('train/grad_norm').current()
    assert global_norm > group_norm > 1e-3


def test_per_module_pattern_that_matches_nothing_is_an_error():
    data = StepToyDataset()
    model, wrapper = make(
        clip_grad_per_module=[dict(pattern='roi_head', max_norm=0.5)])
    with pytest.raises(ValueError, match="'roi_head' matches no parameter"):
        model.train_step(batch(data, 0, 1), wrapper)


@pytest.mark.parametrize('device', cpu_and_cuda())
def test_amp_nan_keeps_scaler_legal_and_backs_off(fresh_state, device):
    data = StepToyDataset(faults=[(2, 'nan_loss')])
    model, wrapper = make(AmpNaNSkipOptimWrapper, device=device,
                          clip_grad=dict(max_norm=10.0))
    assert wrapper.device_type == device
    model.train_step(batch(data, 0, 1), wrapper)
    scale = wrapper.loss_scaler.get_scale()
    before = params(model)
    model.train_step(batch(data, 2, 3), wrapper)  # NaN: skipped
    assert same(before, params(model))
    assert wrapper.loss_scaler.get_scale() == scale / 2
    model.train_step(batch(data, 4, 5), wrapper)  # scaler still legal
    assert not same(before, params(model))
    assert wrapper.counters['nan_skips'] == 1
    assert wrapper.counters['amp_overflow'] == 0
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize('device', cpu_and_cuda())
def test_amp_fp16_overflow_is_counted_apart(fresh_state, device):
    skip_without_autocast(device, 'float16')
    data = StepToyDataset()
    model, wrapper = make(AmpNaNSkipOptimWrapper, dtype='float16',
                          device=device,
                          loss_scale=dict(init_scale=2.0**40))
    before = params(model)
    model.train_step(batch(data, 0, 1), wrapper)
    assert same(before, params(model))
    assert wrapper.counters['amp_overflow'] == 1
    assert wrapper.counters['nan_skips'] == 0
    assert wrapper.loss_scaler.get_scale() == 2.0**39
    assert fresh_state.get_scalar('train/amp_overflows').current() == 1
    state = wrapper.state_dict()
    _, restored = make(AmpNaNSkipOptimWrapper, dtype='float16',
                       device=device)
    restored.load_state_dict(state)
    assert restored.loss_scaler.get_scale() == 2.0**39
    assert restored.counters['amp_overflow'] == 1


def test_amp_flag_of_train_py_picks_the_nan_skip_amp_wrapper():
    from mmsafe.tools import train as train_cli
    for kind in ('NaNSkipOptimWrapper', 'OptimWrapper'):
        cfg = Config(dict(optim_wrapper=dict(type=kind)))
        train_cli.apply_amp(cfg)
        expected = ('AmpNaNSkipOptimWrapper' if kind == 'NaNSkipOptimWrapper'
                    or not torch.cuda.is_available() else 'AmpOptimWrapper')
        assert cfg.optim_wrapper.type == expected


# --------------------------------------------------------------------- #
# 2 processes, gloo, real Runner through tools/train.py
def skip_events(work_dir):
    return read_events(work_dir, 'step_skip')


def test_nan_loss_on_rank1_and_nan_grad_on_rank0():
    """(a) NaN loss on rank 1 at iterations 1 and 4; (b) finite loss with a
    NaN gradient on rank 0 at iteration 3."""
    work_dir, result = runs.guarded_run()
    assert not result.timed_out, result
    assert result.returncode == 0, result
    d0, _ = runs.assert_ranks_identical(work_dir)
    assert d0['last_iter'] == runs.GUARDED_ITERS
    counters = d0['counters']
    assert counters['nan_skips'] == 3
    assert counters['by_reason']['nonfinite_loss'] == 2
    sums = runs.checksums(d0)
    for it in (1, 3, 4):  # skipped: parameters did not move
        assert sums[it] == sums[it - 1], it
    assert sums[2] != sums[1] and sums[7] != sums[6]

    events = skip_events(work_dir)
    by_iter = {}
    for e in events:
        by_iter.setdefault(e['iter'], {})[e['rank']] = e
    for it in (1, 4):  # (a): both ranks skipped, rank 1 saw the NaN loss
        assert by_iter[it][1]['loss'] == ['nan']
        assert 'nonfinite_loss' in by_iter[it][0]['reasons']
        assert runs.file_of(1, it) + ' | ' in by_iter[it][1]['files'][0]
    # (b): finite losses everywhere, the gradient norm decided.
    assert by_iter[3][0]['reasons'] == ['nonfinite_grad']
    assert all(isinstance(v, float) for r in (0, 1)
               for v in by_iter[3][r]['loss'])
    # Rank 0's log names the rank whose loss was not finite, every rank's
    # loss and files.
    lines = [line for line in result.output.splitlines()
             if 'skipped the optimizer step of Iter(train) 2 ' in line]
    assert len(lines) == 1, result
    assert 'the loss was not finite on rank(s) [1]' in lines[0]
    assert 'rank 1: loss=[\'nan\']' in lines[0]
    assert runs.file_of(1, 1) in lines[0] and runs.file_of(0, 1) in lines[0]
    lines = [line for line in result.output.splitlines()
             if 'skipped the optimizer step of Iter(train) 4 ' in line]
    assert 'the losses were finite on every rank, but the gradient is ' \
        'not' in lines[0]
    assert 'grad_norm: nan' not in result.output


def test_max_consecutive_skips_stops_training_on_all_ranks():
    """(e): 3 NaN steps in a row with max_consecutive_skips=3."""
    faults = sum((runs.fault(0, it, 'nan_loss') for it in (1, 2, 3)), [])
    work_dir, result = runs.train(
        'max_skips', faults, 8,
        runs.sgd_wrapper(max_consecutive_skips=3))
    assert not result.timed_out, result
    assert result.returncode != 0, result
    assert '3 optimizer steps in a row were skipped' in result.output
    for it in (1, 2, 3):
        assert f'Iter(train) {it + 1} (nonfinite_' in result.output
        assert runs.file_of(0, it) in result.output
    # Both ranks stopped at the same step: each wrote its 3 skip events.
    events = skip_events(work_dir)
    assert sorted((e['rank'], e['consecutive']) for e in events) == [
        (0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]


def test_accumulation_drops_the_whole_window():
    """(f) accumulative_counts=2, NaN at iteration 2 (first half of the
    window 2-3); also per-module clipping through the Runner."""
    work_dir, result = runs.train(
        'accumulate', runs.fault(1, 2, 'nan_loss'), 6,
        runs.sgd_wrapper(
            accumulative_counts=2, clip_grad=dict(max_norm=10.0),
            clip_grad_per_module=[dict(pattern='bbox_head', max_norm=0.5)]))
    assert not result.timed_out, result
    assert result.returncode == 0, result
    d0, _ = runs.assert_ranks_identical(work_dir)
    assert d0['last_iter'] == 6
    assert d0['counters']['skipped'] == 1
    assert d0['counters']['nan_skips'] == 1
    sums = runs.checksums(d0)
    assert sums[1] != sums[0]  # window 0-1 applied at iteration 1
    assert sums[2] == sums[1] and sums[3] == sums[1]  # window 2-3 dropped
    assert sums[5] != sums[3]  # window 4-5 applied
    events = skip_events(work_dir)
    assert {(e['rank'], tuple(e['iters'])) for e in events} == {
        (0, (2, 3)), (1, (2, 3))}
    rank1 = [e for e in events if e['rank'] == 1][0]
    assert rank1['loss'][0] == 'nan' and rank1['loss'][1] != 'nan'
    assert 'grad_norm_bbox_head' in result.output


def test_resume_restores_counters():
    """(g): resume the guarded run (3 NaN skips) and add one more NaN."""
    work_dir, first = runs.guarded_run()
    assert first.returncode == 0, first
    resumed_dir = osp.join(osp.dirname(work_dir), 'resumed')
    shutil.copytree(work_dir, resumed_dir)
    faults = runs.GUARDED_FAULTS + runs.fault(0, 9, 'nan_loss')
    cfg = runs.make_config(resumed_dir, faults, 12, runs.sgd_wrapper())
    result = runs.run_train(
        cfg, nproc=2, timeout=runs.TIMEOUT,
        args=['--resume', osp.join(resumed_dir, 'iter_8.pth')],
        # The optimizer counters load with weights_only=True; MMEngine's own
        # message-hub state in the checkpoint may not on torch>=2.6 unless
        # mmsafe's checkpoint shim is present: do not depend on it here.
        env=dict(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD='1'))
    assert not result.timed_out, result
    assert result.returncode == 0, result
    d0, _ = runs.assert_ranks_identical(resumed_dir)
    assert d0['last_iter'] == 12
    assert [r['iter'] for r in d0['records']] == list(range(8, 12))
    assert d0['counters']['skipped'] == 4
    assert d0['counters']['nan_skips'] == 4
    assert 'skipped_steps: 4' in result.output


def test_amp_on_cpu_through_nan_and_accumulation():
    """(h) tools/train.py --amp turns NaNSkipOptimWrapper into
    AmpNaNSkipOptimWrapper (CPU autocast, fp16, GradScaler); early fp16
    overflows, NaN loss on rank 1 at iteration 7 (end of window 6-7) and 8
    (first half of window 8-9), accumulative_counts=2."""
    skip_without_autocast('cpu', 'float16')
    faults = runs.fault(1, 7, 'nan_loss') + runs.fault(1, 8, 'nan_loss')
    wrapper = runs.sgd_wrapper(accumulative_counts=2, dtype='float16',
                               loss_scale=dict(init_scale=2.0**22),
                               clip_grad=dict(max_norm=10.0))
    work_dir, result = runs.train('amp', faults, 12, wrapper, args=['--amp'])
    assert not result.timed_out, result
    assert result.returncode == 0, result
    assert 'No inf checks were recorded' not in result.output
    assert 'unscale_() has already been called' not in result.output
    assert "type='AmpNaNSkipOptimWrapper'" in result.output
    d0, _ = runs.assert_ranks_identical(work_dir)
    assert d0['last_iter'] == 12
    c = d0['counters']
    assert c['nan_skips'] == 2
    assert c['amp_overflow'] >= 1
    assert c['skipped'] == c['nan_skips'] + c['amp_overflow']
    causes = {}
    for e in skip_events(work_dir):
        causes.setdefault(tuple(e['iters']), set()).add(e['cause'])
    assert causes[(6, 7)] == {'nan_skips'} and causes[(8, 9)] == {
        'nan_skips'}
    assert list(causes.values()).count({'amp_overflow'}) == c['amp_overflow']
    # Parameters move exactly at the windows that were not skipped.
    sums = runs.checksums(d0)
    for start in range(2, 12, 2):
        unchanged = sums[start + 1] == sums[start - 1]
        assert unchanged == ((start, start + 1) in causes), start
    assert 'amp_overflows: ' in result.output


def test_control_without_the_guard_nan_spreads_to_every_rank():
    """Control for (a): with MMEngine's OptimWrapper the NaN loss of rank 1
    at iteration 3 poisons the parameters of both ranks."""
    work_dir, result = runs.unmanaged_run()
    assert not result.timed_out, result
    assert result.returncode == 0, result
    d0, _ = runs.assert_ranks_identical(work_dir, finite=False)
    assert not all(torch.isfinite(v).all() for v in d0['state_dict'].values())
    sums = runs.checksums(d0)
    assert math.isfinite(sums[2]) and math.isnan(sums[3])


@pytest.mark.parametrize('clip_grad', [
    dict(max_norm=0.05, norm_type=2), dict(max_norm=0.05, norm_type=1),
    dict(type='value', clip_value=0.01)])
def test_clipping_matches_mmengine_optim_wrapper(clip_grad):
    """The wrapper clips with the norm it measured for the skip decision;
    the step must equal MMEngine's OptimWrapper with the same clip_grad."""
    import copy

    import mmsafe  # noqa: F401
    from mmengine.optim import OptimWrapper
    from mmsafe.engine.optimizers import NaNSkipOptimWrapper

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2))
    reference = copy.deepcopy(model)
    x = torch.randn(32, 8)
    wrappers = [
        NaNSkipOptimWrapper(
            optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            clip_grad=dict(clip_grad)),
        OptimWrapper(
            optimizer=torch.optim.SGD(reference.parameters(), lr=0.5),
            clip_grad=dict(clip_grad)),
    ]
    for net, wrapper in zip((model, reference), wrappers):
        for _ in range(3):
            with wrapper.optim_context(net):
                loss = (net(x) ** 2).sum()
            wrapper.update_params(loss)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)

"""EmptyBatchSyncHook: an empty batch on some or all ranks never hangs DDP
and trains as MMEngine would train it; skipping all-empty steps is an
opt-in, and a step without any signal is skipped by the optim wrapper."""
from types import SimpleNamespace

import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper

from mmsafe.engine.hooks import EmptyBatchSyncHook
from mmsafe.engine.hooks.empty_batch_sync_hook import is_empty_batch
from mmsafe.engine.optimizers import NaNSkipOptimWrapper
from mmsafe.events import read_events
from tests.engine import step_toys_runs as runs
from tests.engine.step_toys import StepToyDataset, StepToyDetector


@pytest.fixture(autouse=True)
def fresh_state():
    hub = MessageHub.get_instance('test_empty_batch')
    hub.update_info('iter', 0)
    yield hub


def test_empty_batch_detection():
    data = StepToyDataset(faults=[(0, 'empty'), (1, 'empty')])
    assert is_empty_batch(pseudo_collate([data[0], data[1]]))
    assert not is_empty_batch(pseudo_collate([data[0], data[2]]))
    # No GT at all (not a detection batch): not called empty.
    assert not is_empty_batch(dict(inputs=[torch.zeros(1)],
                                   data_samples=[dict(x=1)]))


@pytest.mark.parametrize('wrapper_cls', [NaNSkipOptimWrapper, OptimWrapper])
def test_empty_batch_loss_reaches_every_parameter(tmp_path, wrapper_cls):
    data = StepToyDataset(faults=[(2, 'empty'), (3, 'empty')])
    torch.manual_seed(0)
    model = StepToyDetector()
    wrapper = wrapper_cls(optimizer=torch.optim.SGD(model.parameters(),
                                                    lr=0.1))
    runner = SimpleNamespace(model=model, optim_wrapper=wrapper, iter=0,
                             work_dir=str(tmp_path))
    hook = EmptyBatchSyncHook()
    hook.before_run(runner)
    hook.before_train(runner)
    seen = {}
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: seen.__setitem__(name, g))

    for it, indices in enumerate(((0, 1), (2, 3))):
        runner.iter = it
        seen.clear()
        batch = pseudo_collate([data[i] for i in indices])
        hook.before_train_iter(runner, it, batch)
        log_vars = model.train_step(batch, wrapper)
        hook.after_train_iter(runner, it, batch, log_vars)
        # Every parameter got a gradient, on the empty batch too, and the
        # loss keys stayed the same.
        assert sorted(seen) == sorted(n for n, _ in model.named_parameters())
        assert sorted(log_vars) == ['loss', 'loss_bbox', 'loss_cls']
    assert not seen['bbox_head.weight'].any()  # a connected zero
    assert log_vars['loss_bbox'] == 0
    events = read_events(str(tmp_path), 'empty_batch')
    assert [(e['iter'], e['files']) for e in events] == [
        (1, ['toy/vis/0002.png | toy/ir/0002.png',
             'toy/vis/0003.png | toy/ir/0003.png'])]
    hook.after_train(runner)
    assert not model._forward_hooks


def test_one_rank_empty_keeps_ddp_in_step():
    """(c): rank 1's batch at iteration 5 is empty and the model drops
    loss_bbox and the bbox_head parameters; find_unused_parameters=False."""
    work_dir, result = runs.guarded_run()
    assert not result.timed_out, result
    assert result.returncode == 0, result
    d0, d1 = runs.assert_ranks_identical(work_dir)
    assert d0['last_iter'] == d1['last_iter'] == runs.GUARDED_ITERS
    sums = runs.checksums(d0)
    assert sums[5] != sums[4]  # the step was taken: rank 0 had signal
    keys = [{r['iter']: r['loss_keys'] for r in d['records']}
            for d in (d0, d1)]
    assert keys[1][5] == keys[0][5] == ['loss', 'loss_bbox', 'loss_cls']
    events = [e for e in read_events(work_dir, 'empty_batch')
              if e['iter'] == 5]
    assert [e['rank'] for e in events] == [1]
    assert events[0]['files'][0].startswith(runs.file_of(1, 5))
    assert ('1 of the last 2 batches (all ranks), up to Iter(train) 6, had '
            'no valid ground truth; they trained on background'
            ) in result.output


def test_all_ranks_empty_trains_on_background_everywhere():
    """(d): every rank's batch at iteration 6 is empty; the classification
    loss still carries signal, so the step trains, as without mmsafe."""
    work_dir, result = runs.guarded_run()
    assert result.returncode == 0, result
    d0, d1 = runs.assert_ranks_identical(work_dir)
    sums = runs.checksums(d0)
    assert sums[6] != sums[5]
    assert 'empty_batch' not in d0['counters']['by_reason']
    empty = sorted(e['rank'] for e in read_events(work_dir, 'empty_batch')
                   if e['iter'] == 6)
    assert empty == [0, 1]
    assert not [e for e in read_events(work_dir, 'step_skip')
                if e['iter'] == 6]
    # Every rank keeps the loss keys it saw before, filled with zeros.
    for d in (d0, d1):
        keys = {r['iter']: r['loss_keys'] for r in d['records']}
        assert keys[6] == ['loss', 'loss_bbox', 'loss_cls']


def test_opt_in_skip_and_a_step_without_signal_skip_everywhere():
    """``skip_all_empty=True``: every rank empty at iteration 2 skips the
    step on both ranks. Without opt-in, a step whose loss carries no signal
    on any rank (zero gradient after the reduce, iteration 4) is skipped by
    NaNSkipOptimWrapper as ``zero_grad``."""
    work_dir, result = runs.opt_in_run()
    assert not result.timed_out, result
    assert result.returncode == 0, result
    d0, _ = runs.assert_ranks_identical(work_dir)
    sums = runs.checksums(d0)
    # SGD with momentum and weight decay would have moved the parameters.
    assert sums[2] == sums[1]
    assert sums[4] == sums[3]
    assert sums[3] != sums[2] and sums[5] != sums[4]
    assert d0['counters']['by_reason'] == {'empty_batch': 1, 'zero_grad': 1}
    skips = read_events(work_dir, 'step_skip')
    assert sorted((e['iter'], e['rank'], e['reasons'][0]) for e in skips) == [
        (2, 0, 'empty_batch'), (2, 1, 'empty_batch'),
        (4, 0, 'zero_grad'), (4, 1, 'zero_grad')]
    assert 'no rank produced any training signal' in result.output


def test_without_mmsafe_optim_wrapper_no_collective_and_no_hang():
    """MMEngine's OptimWrapper: rank 1 empty on its first iteration (before
    any loss key was seen), both ranks empty at iteration 2. The hook adds
    no collective; the connected zero alone keeps DDP in step."""
    work_dir, result = runs.unmanaged_run()
    assert not result.timed_out, result
    assert result.returncode == 0, result
    d0, d1 = runs.assert_ranks_identical(work_dir, finite=False)
    assert d0['last_iter'] == runs.UNMANAGED_ITERS
    sums = runs.checksums(d0)
    assert sums[1] != sums[0]
    assert sums[2] != sums[1]  # all empty: trains on the classification loss
    keys = {r['iter']: r['loss_keys'] for r in d1['records']}
    # No key exchange: rank 1 cannot know loss_bbox before it saw it.
    assert keys[0] == ['loss', 'loss_cls']
    assert keys[2] == ['loss', 'loss_bbox', 'loss_cls']
    assert sorted((e['rank'], e['iter'])
                  for e in read_events(work_dir, 'empty_batch')) == [
                      (0, 2), (1, 0), (1, 2)]


def test_control_without_the_hook_ddp_fails_or_hangs():
    """Control for (c): the same empty batch without EmptyBatchSyncHook."""
    _, result = runs.control_empty_run()
    assert result.timed_out or result.returncode != 0, result
    if not result.timed_out:
        assert 'Expected to have finished reduction' in result.output, result

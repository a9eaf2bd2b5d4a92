"""ScalarBandsHook: a band stop ends a 2-process run on the same iteration
on every rank (checkpoint saved, reason logged, loop ended mid-epoch):
cleanly under SafeRunner, with StopTraining's message and a non-zero exit
under MMEngine's stock Runner; warn bands respect patience; healthy bands
stay silent."""
import json
import os.path as osp
import re
import tempfile

import torch

from tests.engine.check_toys_cfg import toy_config
from tests.engine.check_toys_run import events, healthy_run, why
from tests.utils import REPO_ROOT, run_train

BANDS = """[dict(type='ScalarBandsHook', bands=[
    dict(key='loss*', finite=True, action='stop'),
    dict(key='grad_norm', max=1e-9, action='warn', patience=3)]),
    dict(type='SafetyReportHook')]"""

# The safety fragment: runner_type = 'SafeRunner' (its custom_hooks are
# replaced by the test's own).
SAFETY = '_base_ = [{!r}]'.format(
    osp.join(REPO_ROOT, 'configs', '_base_', 'safety_runtime.py'))


def _nan_on_rank1_config(tmp, name, extra):
    # 64 samples, batch 8, 2 ranks: 4 iterations per epoch. Rank 1's
    # loss_cls is NaN from its 4th forward (iteration 4, epoch 1); the
    # optim wrapper skips those steps, so rank 0's losses stay finite. The
    # stop request travels at the next sync (log interval 5): every rank
    # stops at iteration 5, inside epoch 2.
    return toy_config(
        tmp, name, BANDS, model='nan_at_iter=3, nan_rank=1',
        max_epochs=3, optim_extra=", type='NaNSkipOptimWrapper', "
        'clip_grad=dict(max_norm=1e6)', extra=extra)


def test_healthy_bands_silent():
    work_dir, result = healthy_run()
    assert result.returncode == 0 and not result.timed_out, why(result)
    assert not events(work_dir, 'band_violation')
    assert not events(work_dir, 'band_stop')


def test_nan_on_one_rank_stops_every_rank_cleanly():
    tmp = tempfile.mkdtemp()
    cfg = _nan_on_rank1_config(tmp, 'stop', SAFETY)
    result = run_train(cfg, nproc=2, timeout=400)
    assert result.returncode == 0 and not result.timed_out, why(result)
    work_dir = osp.join(tmp, 'stop')
    stops = events(work_dir, 'band_stop')
    assert {e['rank'] for e in stops} == {0, 1}, stops
    assert {e['iter'] for e in stops} == {5}, stops
    for stop in stops:  # every rank logs every rank's reasons
        assert 'train/loss_cls=nan is not finite' in stop['reason'], stop
        assert 'iteration 4' in stop['reason'], stop
        assert 'rank 1' in stop['reason'] and 'rank 0' not in stop['reason']
    assert 'stopping the run at iteration 5' in result.output
    # SafeRunner ended the run after the StopTraining of both ranks: their
    # after_run hooks ran (the safety report of a finished run, from both).
    checkpoint = osp.join(work_dir, 'band_stop_iter_5.pth')
    assert re.search(r'training stopped by a hook: .*train/loss_cls=nan .*'
                     + re.escape(f'(saved {checkpoint})'), result.output), \
        why(result)
    assert 'Epoch(train) [3]' not in result.output
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        report = json.load(f)
    assert report['status'] == 'finished', report
    assert report['ranks_reported'] == [0, 1], report
    ckpt = torch.load(osp.join(work_dir, 'band_stop_iter_5.pth'),
                      map_location='cpu', weights_only=False)
    assert ckpt['meta']['iter'] == 5 and ckpt['meta']['epoch'] == 1
    # grad_norm above its band from the first iteration: one warning after
    # 3 consecutive values, on each rank.
    warns = [e for e in events(work_dir, 'band_violation')
             if e['action'] == 'warn']
    assert sorted(e['rank'] for e in warns) == [0, 1], warns
    assert {e['iter'] for e in warns} == {3}, warns


def test_band_matching_and_activation():
    from mmsafe.engine.hooks.scalar_bands_hook import Band
    band = Band(key='pascal_voc/mAP', min=0.52, after_epoch=1)
    assert band.matches('val/pascal_voc/mAP')
    assert not band.matches('val/pascal_voc/AP50')
    assert not band.active(iteration=100, epoch=0) and band.active(100, 1)
    assert band.violation(0.5) and band.violation(float('nan'))
    assert band.violation(0.6) is None
    losses = Band(key='loss*', finite=True)
    assert losses.matches('train/loss') and losses.matches('train/loss_macl')
    assert not losses.matches('train/grad_norm')
    assert losses.violation(float('inf')) and losses.violation(1e9) is None
    late = Band(key='loss_macl', max=1.0, after_iter=50)
    assert not late.active(50, 0) and late.active(51, 0)


def test_validation_band_stops_iteration_loop():
    tmp = tempfile.mkdtemp()
    hooks = """[dict(type='ScalarBandsHook', bands=[
        dict(key='toy/acc', min=1.01, after_iter=2, action='stop')])]"""
    cfg = toy_config(tmp, 'valstop', hooks, max_iters=20, val_interval=4,
                     extra=SAFETY)
    result = run_train(cfg, timeout=400)
    assert result.returncode == 0 and not result.timed_out, why(result)
    work_dir = osp.join(tmp, 'valstop')
    (stop, ) = events(work_dir, 'band_stop')
    assert stop['iter'] == 4 and 'val/toy/acc=' in stop['reason'], stop
    assert osp.exists(osp.join(work_dir, 'band_stop_iter_4.pth'))
    assert 'stopping the run at iteration 4' in result.output
    assert 'Iter(train) [ 5/20]' not in result.output


def test_stop_under_stock_runner_ends_with_its_message():
    """With MMEngine's plain Runner (runner_type='Runner'; on CPU it runs a
    single process), the StopTraining raised mid-epoch ends the run with
    its message and a non-zero exit, after the stop checkpoint."""
    tmp = tempfile.mkdtemp()
    cfg = toy_config(
        tmp, 'stock', BANDS, model='nan_at_iter=3, nan_rank=0',
        max_epochs=3, optim_extra=", type='NaNSkipOptimWrapper', "
        'clip_grad=dict(max_norm=1e6)', extra="runner_type = 'Runner'")
    result = run_train(cfg, nproc=1, timeout=400)
    assert not result.timed_out, why(result)
    assert result.returncode != 0, why(result)
    work_dir = osp.join(tmp, 'stock')
    stops = events(work_dir, 'band_stop')
    assert [e['rank'] for e in stops] == [0], stops
    assert osp.exists(osp.join(work_dir, stops[0]['checkpoint'])), stops
    assert re.search(r'StopTraining: \[mmsafe\] training stopped: .*'
                     r'train/loss_cls=nan', result.output), why(result)
    assert 'SafeRunner' not in result.output, why(result)
    assert 'Epoch(train) [2]' not in result.output

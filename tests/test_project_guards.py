"""Every guard on a user's own dual-modality project, through
tools/train.py with one ``custom_imports`` line plus the declaration.

The project (tests/project_standin.py, written to a folder of the test's
own) registers its dataset, paired loading transform, paired flip, packer,
preprocessor and two-stream model in MMDetection's registries under the
field's common names, carries the infrared image under its own results key
(``img_lwir``), data-sample field (``infrared_img``) and file key
(``lwir_path``), hands the model a dict ``{'rgb', 'lwir'}`` or one
6-channel tensor, and returns its contrastive loss inside its RoI head's
nested dict (``roi.macl.loss_contrast``, weighted 0.5).

Runs (each process start costs the imports; faults are combined where the
assertions stay apart):

* healthy, mmsafe on (dict layout, declared) and off: weights
  ``torch.equal``; no flag on the project's healthy pairs; the safety
  report lists each guard's status;
* one process, dict layout: a NaN loss (iteration 3), a NaN hidden by
  ``nan_to_num`` (iteration 5), a ``loss_total`` counted twice, the
  infrared image flipped alone (the pipeline run twice), a lambda in the
  pipeline under spawn workers and one in the preprocessor (ignoring its
  own ``bgr_to_rgb``);
* one process: the partner lookup finds nothing (the contrastive term
  never appears);
* 2 DDP ranks, 6-channel layout recognised, nothing declared: an empty
  batch on rank 0 (iteration 2), the contrastive term vanishing on rank 1
  at iteration 4, infrared files shifted by one frame;
* the healthy run stopped by SIGTERM and resumed: the weights of the run
  that was never stopped.
"""
import json
import os
import os.path as osp

import pytest
import torch

from mmsafe.events import read_events
from tests.project_standin import SOURCE
from tests.utils import (REPO_ROOT, run_once_per_session, run_train,
                         write_config)

pytestmark = pytest.mark.slow

PROJECT = 'rgbt_standin'
SAFETY = osp.join(REPO_ROOT, 'configs', '_base_', 'safety_runtime.py')

#: the declaration a project writes for the dict layout
DECLARATION = """
mmsafe_modalities = dict(
    model_inputs=dict(visible='inputs.rgb', infrared='inputs.lwir'),
    batch_inputs=dict(visible='inputs', infrared='data_samples.infrared_img'),
    results=dict(visible='img', infrared='img_lwir'),
    files=dict(visible='img_path', infrared='lwir_path'),
    losses=dict(loss_contrast=0.5))
"""

CONFIG = """
{base}
default_scope = 'mmdet'
custom_imports = dict(imports=[{imports}], allow_failed_imports=False)
{declaration}
work_dir = {work_dir!r}
randomness = dict(seed=0)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
model = dict(
    type='TwoStreamFasterRCNN', loss_total={loss_total},
    data_preprocessor=dict(
        type='PairedDetDataPreprocessor', layout={layout!r},
        hold_lambda={hold_lambda}, mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375], bgr_to_rgb=True, pad_size_divisor=32),
    roi_head=dict(type='ContrastRoIHead', nan_to_num={nan_to_num},
                  vanish_rank={vanish_rank}, vanish_at={vanish_at},
                  macl=dict(type='MACLHead', loss_weight=0.5)))
model_wrapper_cfg = dict(type='MMDistributedDataParallel',
                         find_unused_parameters=True)
train_dataloader = dict(
    batch_size=4, num_workers={workers}, persistent_workers=False,
    {loader_extra}
    sampler=dict(type={sampler!r}, shuffle={shuffle}),
    dataset=dict(type='LLVIPDataset', data_root={data_root!r},
                 {dataset_extra}
                 pipeline=[dict(type='LoadPairedImageFromFile'),
                           dict(type='PairedRandomFlip', prob=0.5),
                           {extra_transform}
                           dict(type='PackPairedInputs')]))
train_cfg = {train_cfg}
optim_wrapper = dict(type={wrapper!r},
                     optimizer=dict(type='SGD', lr=0.01, momentum=0.9))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval={log_interval}),
    checkpoint=dict(type='CheckpointHook', interval={ckpt_interval},
                    by_epoch={by_epoch}))
log_processor = dict(by_epoch={by_epoch})
log_level = 'INFO'
{extra}
"""


def _config(folder: str, name: str, mmsafe: bool = True,
            declared: bool = True, **options) -> tuple:
    """Write the project, its data and a config; returns ``(config,
    work_dir, env)``."""
    from tests.tools.check_dataset_toys import synthetic_demo_tree
    with open(osp.join(folder, f'{PROJECT}.py'), 'w') as f:
        f.write(SOURCE)
    data_root = osp.join(folder, 'llvip')
    if not osp.isdir(data_root):
        synthetic_demo_tree(data_root)
    work_dir = osp.join(folder, name)
    values = dict(
        base=f'_base_ = [{SAFETY!r}]' if mmsafe else '',
        imports=(f"'mmsafe', {PROJECT!r}" if mmsafe else repr(PROJECT)),
        declaration=DECLARATION if mmsafe and declared else '',
        work_dir=work_dir, data_root=data_root + '/', loss_total=False,
        layout='dict', hold_lambda=False, nan_to_num=False,
        vanish_rank=None, vanish_at=None, workers=0, loader_extra='',
        shuffle=True, dataset_extra='', extra_transform='', max_iters=8,
        wrapper='NaNSkipOptimWrapper' if mmsafe else 'OptimWrapper',
        log_interval=4, extra='' if mmsafe else "runner_type = 'Runner'")
    values.update(options)
    if values.pop('epochs', None):
        # 2 epochs of 6 iterations: the loop whose resume is exact on every
        # supported MMEngine (MMEngine 0.7's iteration loop replays nothing)
        values.update(sampler='DefaultSampler', by_epoch=True,
                      ckpt_interval=2, train_cfg="dict(type="
                      "'EpochBasedTrainLoop', max_epochs=2)")
    else:
        values.update(sampler='InfiniteSampler', by_epoch=False,
                      ckpt_interval=values['max_iters'], train_cfg=f"dict("
                      f"type='IterBasedTrainLoop', "
                      f"max_iters={values['max_iters']})")
    cfg = write_config(osp.join(folder, f'{name}.py'),
                       CONFIG.format(**values))
    env = {'PYTHONPATH': os.pathsep.join(
        [REPO_ROOT, folder, os.environ.get('PYTHONPATH', '')])}
    return cfg, work_dir, env


def _weights(work_dir: str, name: str) -> dict:
    from mmsafe.checkpoint import load_checkpoint_file
    return load_checkpoint_file(osp.join(work_dir, f'{name}.pth'),
                                map_location='cpu')['state_dict']


def _healthy(mmsafe: bool):
    def run(folder):
        cfg, work_dir, env = _config(folder, 'healthy', mmsafe=mmsafe,
                                     epochs=True)
        return work_dir, run_train(cfg, timeout=300, env=env)
    return run_once_per_session(
        f'project_healthy_{"on" if mmsafe else "off"}', run)


def _ok(result) -> str:
    return result.output[-6000:]


def test_healthy_project_run_is_bit_identical_and_reports_guards():
    on_dir, on = _healthy(True)
    off_dir, off = _healthy(False)
    assert on.returncode == 0 and not on.timed_out, _ok(on)
    assert off.returncode == 0 and not off.timed_out, _ok(off)
    on_w, off_w = _weights(on_dir, 'epoch_2'), _weights(off_dir, 'epoch_2')
    assert on_w.keys() == off_w.keys()
    assert [k for k in on_w if not torch.equal(on_w[k], off_w[k])] == []
    out = on.output
    # what was declared, and used
    assert ('modalities: model inputs: visible=inputs.rgb, infrared='
            'inputs.lwir (config mmsafe_modalities)') in out, _ok(on)
    assert 'demanding loss_contrast (config mmsafe_modalities)' in out
    assert 'chance level judged on loss_contrast with weight 0.5' in out
    # the project's transforms record no per-modality geometry: said once
    assert out.count('the pair-geometry check is off for this run') == 1
    assert "results['img_lwir']" in out
    # no false alarm on the project's healthy pairs
    assert read_events(on_dir, 'first_batch_flag') == []
    stats = read_events(on_dir, 'first_batch_stats')[0]
    assert sorted(stats['modalities']) == ['infrared', 'visible']
    assert stats['files'][0].endswith('.jpg') and \
        'infrared' in stats['ir_files'][0], stats['ir_files']
    assert not read_events(on_dir, 'macl_presence')
    assert not read_events(on_dir, 'step_skip')
    with open(osp.join(on_dir, 'safety_report.json')) as f:
        report = json.load(f)
    guards = report['guards']
    assert guards['SafeRunner']['status'] == 'active'
    assert guards['NaNSkipOptimWrapper']['status'] == 'active'
    assert guards['MACLCheckHook']['status'] == 'active', guards
    fbs = guards['FirstBatchStatsHook']
    assert fbs['status'] == 'partial', fbs
    assert fbs['checks']['pairing content']['status'] == 'active'
    assert fbs['checks']['pair geometry']['status'] == 'inactive'
    for name in ('EmptyBatchSyncHook', 'LossDictLintHook',
                 'DataLoaderProbeHook', 'HangWatchdogHook',
                 'PreemptionHook'):
        assert guards[name]['status'] == 'active', (name, guards[name])
    assert report['modalities']['files'] == dict(visible='img_path',
                                                 infrared='lwir_path')
    assert 'guards           : ' in out


def test_project_faults_in_one_process_are_each_named(tmp_path):
    cfg, work_dir, env = _config(
        str(tmp_path), 'faults', shuffle=False, max_iters=6,
        dataset_extra="pipeline_twice=True, faults={8: ['nan_loss'], "
        "16: ['hidden_nan']},", nan_to_num=True, loss_total=True,
        hold_lambda=True, workers=2,
        loader_extra="multiprocessing_context='spawn',",
        extra_transform="dict(type='PairedToContiguous'),",
        extra="custom_hooks = [dict(h, policy='warn') if h['type'] == "
        "'LossDictLintHook' else h for h in _base_.custom_hooks]")
    result = run_train(cfg, timeout=300, env=env)
    out = result.output
    assert result.returncode == 0 and not result.timed_out, _ok(result)
    skips = {e['iter']: e for e in read_events(work_dir, 'step_skip')}
    # the NaN loss: iteration 3 (samples 8-11), named with both files
    nan = skips[2]
    assert nan['reasons'][0] == 'nonfinite_loss', nan
    # (sample i is frame 0100{i+1:02d})
    assert any('visible/train/010009.jpg | ' in f and
               'infrared/train/010009.jpg' in f for f in nan['files']), \
        nan['files']
    # ... and the term it is in
    assert 'loss_contrast is not finite' in out
    # the NaN that nan_to_num hid: the loss dict reads finite, only the
    # gradient shows it (iteration 5, samples 16-19); the term cannot be
    # told
    hidden = skips[4]
    assert hidden['reasons'][0] == 'nonfinite_grad', hidden
    assert all(v == v for v in hidden['loss']), hidden  # finite
    assert 'replaced before the loss dict' in out
    assert sorted(skips) == [2, 4], sorted(skips)
    # loss_total counted twice
    lint = read_events(work_dir, 'loss_dict_lint')[0]
    assert any('"loss_total" is computed from' in f
               for f in lint['findings']), lint
    # the infrared image flipped alone (the pipeline run twice)
    flags = read_events(work_dir, 'first_batch_flag')
    mirrored = [f for f in flags if f['flag'] == 'pair_mirrored']
    assert mirrored, [f['flag'] for f in flags]
    assert mirrored[0]['file'].endswith('.jpg')
    assert 'infrared' in mirrored[0]['ir_file']
    assert 'FirstBatchStatsHook: pair_mirrored' in out
    # the preprocessor's lambda ignores its own bgr_to_rgb: named; it is
    # never sent to a loader worker (the preprocessor runs in the training
    # process), so spawn cannot fail on it
    conversion = [f for f in flags if f['flag'] == 'channel_conversion']
    assert conversion and conversion[0]['modality'] == 'visible'
    assert 'bgr_to_rgb=True but keeps the channel order' in \
        conversion[0]['message']
    # the pipeline's lambda under spawn: named, loader falls back
    fallback = read_events(work_dir, 'dataloader_fallback')
    assert fallback and 'dataset.pipeline.transforms[2].convert' in \
        fallback[0]['cause'], fallback
    # ... and the model receives BGR against ImageNet's RGB mean
    assert 'channel_order' in {f['flag'] for f in flags}
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        report = json.load(f)
    assert report['status'] == 'finished' and report['iter'] == 6


def test_partner_lookup_that_finds_nothing_is_named(tmp_path):
    cfg, work_dir, env = _config(
        str(tmp_path), 'nopartner', max_iters=2,
        dataset_extra="partner_lookup='serialised',")
    result = run_train(cfg, timeout=300, env=env)
    out = result.output
    assert result.returncode == 0 and not result.timed_out, _ok(result)
    presence = read_events(work_dir, 'macl_presence')
    assert presence and presence[0]['iter'] == 1, presence
    assert presence[0]['terms'] == ['loss_contrast']
    assert 'MACLCheckHook at iteration 1: loss_contrast is missing' in out
    # the preprocessor's fallback: the visible image twice
    flags = read_events(work_dir, 'first_batch_flag')
    assert {f['flag'] for f in flags} == {'identical'}, flags
    assert flags[0]['file'].endswith('.jpg')


@pytest.mark.timeout(600)
def test_ddp_faults_on_one_rank_in_the_6_channel_layout(tmp_path):
    cfg, work_dir, env = _config(
        str(tmp_path), 'ddp', declared=False, layout='channels',
        shuffle=False, max_iters=6, log_interval=5, vanish_rank=1,
        vanish_at=4, dataset_extra="ir_offset=1, faults={8: ['empty'], "
        "10: ['empty'], 12: ['empty'], 14: ['empty']},")
    result = run_train(cfg, nproc=2, timeout=400, env=env)
    out = result.output
    assert result.returncode == 0 and not result.timed_out, _ok(result)
    # recognised, and said so
    assert ('modalities: model inputs: visible=inputs[0:3], '
            'infrared=inputs[3:6] (recognised: one 6-channel tensor') in out
    # the empty batch: rank 0, iterations 2 and 5 (rank 0 sees its 12
    # samples every 3 iterations), its files
    empty = read_events(work_dir, 'empty_batch')
    assert [(e['rank'], e['iter']) for e in empty] == [(0, 1), (0, 4)], \
        empty
    # samples 8, 10, 12, 14; the partner of frame i is frame i + 1
    assert any('visible/train/010009.jpg | ' in f and
               'infrared/train/010010.jpg' in f for f in empty[0]['files']), \
        empty
    # the contrastive term vanishing on rank 1 at iteration 4: rank 1 at
    # once, every rank at the first sync, naming the rank
    local = [e for e in read_events(work_dir, 'macl_presence_local')
             if e['problem'] == 'missing']
    assert [(e['rank'], e['iter']) for e in local] == [(1, 4)], local
    assert local[0]['term'] == 'loss_contrast'
    for rank in (0, 1):
        assert ('MACLCheckHook at iteration 5 (on rank(s) 1 of 2; reported '
                f'by rank {rank}): loss_contrast is missing') in out, \
            _ok(result)
    faults = read_events(work_dir, 'rank_fault_loss_terms')
    assert [(e['rank'], e['iter'], e['missing']) for e in faults] == [
        (1, 4, ['roi.macl.loss_contrast'])], faults
    # infrared files shifted by one frame: unrelated partners, named
    unrelated = [f for f in read_events(work_dir, 'first_batch_flag')
                 if f['flag'] == 'pair_unrelated' and f['rank'] == 0]
    assert len(unrelated) >= 8, unrelated
    assert all(f['ir_file'] and 'infrared' in f['ir_file']
               for f in unrelated)
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        guards = json.load(f)['guards']
    assert ('recognised loss_contrast in the loss dict; demanded from now '
            'on, on every rank; chance level judged on loss_contrast with '
            'weight 1 (assumed)') in out
    # nothing declared: the InfoNCE weight is assumed, hence partial
    assert guards['MACLCheckHook']['status'] == 'partial', guards
    assert 'assumed' in guards['MACLCheckHook']['detail']


@pytest.mark.timeout(600)
def test_stop_signal_and_exact_resume_on_the_project(tmp_path):
    """SIGTERM in the middle of the healthy project run: one checkpoint,
    the preemption exit code; ``--resume`` ends on the weights of the run
    that was never stopped (shuffled sampler, the project's random flip)."""
    import signal
    import sys

    from mmsafe.engine.runner.stop import PREEMPTED_EXIT_CODE
    from tests.utils import TRAIN, run_and_signal
    full_dir, full = _healthy(True)
    assert full.returncode == 0, _ok(full)
    cfg, work_dir, env = _config(
        str(tmp_path), 'stopped', epochs=True,
        imports=f"'mmsafe', {PROJECT!r}, 'tests.engine.preempt_toys'",
        extra="custom_hooks = _base_.custom_hooks + [dict(type="
        "'ProgressHook', delay=0.3)]")
    progress = osp.join(work_dir, 'progress_rank0')

    def at_iteration_3():
        try:
            with open(progress) as f:
                return int(f.read() or 0) >= 3
        except (OSError, ValueError):
            return False

    stopped = run_and_signal(
        [sys.executable, TRAIN, cfg], 300,
        [(at_iteration_3, lambda proc: os.kill(proc.pid, signal.SIGTERM))],
        env=env)
    assert stopped.returncode == PREEMPTED_EXIT_CODE, _ok(stopped)
    done = read_events(work_dir, 'preempted')[0]['iter']
    assert 3 <= done < 12
    resumed = run_train(cfg, timeout=300, args=['--resume'], env=env)
    assert resumed.returncode == 0, _ok(resumed)
    assert ': exact: the same remaining samples' in resumed.output, \
        _ok(resumed)
    got = _weights(work_dir, 'epoch_2')
    want = _weights(full_dir, 'epoch_2')
    assert [k for k in got if not torch.equal(got[k], want[k])] == []

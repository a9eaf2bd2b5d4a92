"""Checkpoints of real MMDetection runs load with mmsafe's loader on every
torch (train, ``--resume``, ``--resume PATH``, ``load_from``), and a
checkpoint holding any other pickled object is refused without running
it."""
import os
import os.path as osp
import pickle
import re

import pytest
import torch

from tests.engine import ckpt_toys
from tests.utils import run_train, write_config

# A real MMDetection Faster R-CNN (tiny ResNet-18, 64x64 images) with SGD
# momentum, two parameter schedulers and the message hub: everything a real
# MMDetection checkpoint holds.
MMDET_CONFIG = """
default_scope = 'mmdet'
custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)
runner_type = 'SafeRunner'
data_root = {data_root!r}
model = dict(
    type='FasterRCNN',
    data_preprocessor=dict(type='DetDataPreprocessor',
                           mean=[0., 0., 0.], std=[255., 255., 255.],
                           bgr_to_rgb=True, pad_size_divisor=32),
    backbone=dict(type='ResNet', depth=18, base_channels=8, num_stages=3,
                  strides=(1, 2, 2), dilations=(1, 1, 1),
                  out_indices=(0, 1, 2), frozen_stages=-1,
                  norm_cfg=dict(type='BN', requires_grad=True),
                  norm_eval=False, style='pytorch', init_cfg=None),
    neck=dict(type='FPN', in_channels=[8, 16, 32], out_channels=16,
              num_outs=3),
    rpn_head=dict(
        type='RPNHead', in_channels=16, feat_channels=16,
        anchor_generator=dict(type='AnchorGenerator', scales=[4],
                              ratios=[1.0], strides=[4, 8, 16]),
        bbox_coder=dict(type='DeltaXYWHBBoxCoder',
                        target_means=[.0, .0, .0, .0],
                        target_stds=[1.0, 1.0, 1.0, 1.0]),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=True,
                      loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
    roi_head=dict(
        type='StandardRoIHead',
        bbox_roi_extractor=dict(
            type='SingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0),
            out_channels=16, featmap_strides=[4, 8, 16]),
        bbox_head=dict(
            type='Shared2FCBBoxHead', in_channels=16, fc_out_channels=32,
            roi_feat_size=7, num_classes=1,
            bbox_coder=dict(type='DeltaXYWHBBoxCoder',
                            target_means=[0., 0., 0., 0.],
                            target_stds=[0.1, 0.1, 0.2, 0.2]),
            reg_class_agnostic=False,
            loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False,
                          loss_weight=1.0),
            loss_bbox=dict(type='L1Loss', loss_weight=1.0))),
    train_cfg=dict(
        rpn=dict(
            assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.7,
                          neg_iou_thr=0.3, min_pos_iou=0.3,
                          match_low_quality=True, ignore_iof_thr=-1),
            sampler=dict(type='RandomSampler', num=64, pos_fraction=0.5,
                         neg_pos_ub=-1, add_gt_as_proposals=False),
            allowed_border=-1, pos_weight=-1, debug=False),
        rpn_proposal=dict(nms_pre=200, max_per_img=100,
                          nms=dict(type='nms', iou_threshold=0.7),
                          min_bbox_size=0),
        rcnn=dict(
            assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.5,
                          neg_iou_thr=0.5, min_pos_iou=0.5,
                          match_low_quality=False, ignore_iof_thr=-1),
            sampler=dict(type='RandomSampler', num=32, pos_fraction=0.25,
                         neg_pos_ub=-1, add_gt_as_proposals=True),
            pos_weight=-1, debug=False)),
    test_cfg=dict(
        rpn=dict(nms_pre=200, max_per_img=100,
                 nms=dict(type='nms', iou_threshold=0.7), min_bbox_size=0),
        rcnn=dict(score_thr=0.05, nms=dict(type='nms', iou_threshold=0.5),
                  max_per_img=20)))
train_dataloader = dict(
    batch_size=2, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(
        type='CocoDataset', data_root=data_root, ann_file='ann.json',
        data_prefix=dict(img='images/'), metainfo=dict(classes=('person', )),
        filter_cfg=dict(filter_empty_gt=False),
        pipeline=[dict(type='LoadImageFromFile'),
                  dict(type='LoadAnnotations', with_bbox=True),
                  dict(type='RandomFlip', prob=0.5),
                  # no Resize: no scale_factor (MMDetection 3.0 packs only
                  # the meta keys named, each of which must be there)
                  dict(type='PackDetInputs',
                       meta_keys=('img_id', 'img_path', 'ori_shape',
                                  'img_shape', 'flip', 'flip_direction'))]))
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=2, val_interval=100)
optim_wrapper = dict(type='OptimWrapper',
                     optimizer=dict(type='SGD', lr=0.01, momentum=0.9,
                                    weight_decay=1e-4))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=2),
    dict(type='MultiStepLR', begin=0, end=10, by_epoch=True, milestones=[1],
         gamma=0.1)]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=1),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=1),
    sampler_seed=dict(type='DistSamplerSeedHook'))
env_cfg = dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo'))
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0)
"""


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """One real 2-epoch MMDetection run; its work dir holds epoch_1/2."""
    root = tmp_path_factory.mktemp('ckpt_compat')
    ckpt_toys.make_tiny_coco(str(root / 'data'))
    config = write_config(
        str(root / 'faster_rcnn_tiny.py'),
        MMDET_CONFIG.format(data_root=str(root / 'data') + '/'))
    work_dir = str(root / 'work')
    result = run_train(config, timeout=600, args=['--work-dir', work_dir])
    assert result.returncode == 0, result
    assert osp.isfile(osp.join(work_dir, 'epoch_2.pth')), result
    return root, config, work_dir


def test_stock_torch_load_refuses_mmengine_checkpoint(trained):
    """The failure mmsafe fixes: torch.load(weights_only=True) (the default
    since torch 2.6) cannot read MMEngine's own checkpoint, on every
    torch."""
    _, _, work_dir = trained
    with pytest.raises(pickle.UnpicklingError, match='HistoryBuffer'):
        torch.load(osp.join(work_dir, 'epoch_1.pth'), weights_only=True)


def test_allowlist_loads_real_checkpoint_with_weights_only(trained):
    import mmsafe  # noqa: F401
    from mmengine.runner.checkpoint import _load_checkpoint

    from mmsafe.checkpoint import (load_checkpoint_file,
                                   register_local_weights_only_scheme,
                                   trusted_checkpoint_globals)
    _, _, work_dir = trained
    path = osp.join(work_dir, 'epoch_2.pth')
    register_local_weights_only_scheme()  # as SafeRunner does
    with trusted_checkpoint_globals():
        direct = load_checkpoint_file(path, map_location='cpu')
        ckpt = _load_checkpoint(path, map_location='cpu')
    assert set(ckpt) >= {'meta', 'state_dict', 'optimizer', 'message_hub',
                         'param_schedulers'}
    assert ckpt['meta']['epoch'] == 2
    assert ckpt['meta']['dataset_meta']['classes'] == ('person', )
    buffers = ckpt['message_hub']['log_scalars']
    assert 'train/loss' in buffers and len(buffers['train/loss'].data[0])
    assert torch.equal(direct['state_dict']['backbone.conv1.weight'],
                       ckpt['state_dict']['backbone.conv1.weight'])


def test_resume_auto_resume_path_and_load_from(trained):
    root, config, work_dir = trained
    # --resume (auto): continue from epoch_2 up to epoch 3.
    result = run_train(config, timeout=600, args=[
        '--work-dir', work_dir, '--resume', '--cfg-options',
        'train_cfg.max_epochs=3'])
    assert result.returncode == 0, result
    assert 'resumed epoch: 2, iter: 4' in result.output, result
    assert 'Epoch(train) [3][2/2]' in result.output, result
    assert 'Epoch(train) [1]' not in result.output, result
    assert 'UnpicklingError' not in result.output
    # --resume PATH: back to epoch_1 in a fresh work dir.
    other = str(root / 'work_path')
    result = run_train(config, timeout=600, args=[
        '--work-dir', other, '--resume', osp.join(work_dir, 'epoch_1.pth')])
    assert result.returncode == 0, result
    assert 'resumed epoch: 1, iter: 2' in result.output, result
    assert 'Epoch(train) [2][2/2]' in result.output, result
    # load_from: weights only, training starts at epoch 1.
    fresh = str(root / 'work_load')
    result = run_train(config, timeout=600, args=[
        '--work-dir', fresh, '--cfg-options',
        f"load_from={osp.join(work_dir, 'epoch_2.pth')}",
        'train_cfg.max_epochs=1'])
    assert result.returncode == 0, result
    assert re.search(r'Load checkpoint from .*epoch_2\.pth', result.output)
    assert 'Epoch(train) [1][2/2]' in result.output, result


def test_plain_runner_is_mmengine_unchanged(trained):
    """Importing mmsafe changes nothing: with MMEngine's own Runner
    (runner_type='Runner') loading the run's checkpoint behaves exactly as
    without mmsafe (on torch >= 2.6 it fails, weights-only; on older torch
    MMEngine's plain torch.load reads it unrestricted); SafeRunner is what
    the config opts into.
    """
    root, config, work_dir = trained
    path = osp.join(work_dir, 'epoch_2.pth')
    try:
        torch.load(path, map_location='cpu')
        plain_load_fails = False
    except pickle.UnpicklingError:
        plain_load_fails = True
    result = run_train(config, timeout=300, args=[
        '--work-dir', str(root / 'work_plain'), '--cfg-options',
        f'load_from={path}', 'train_cfg.max_epochs=1',
        'runner_type=Runner'])
    if plain_load_fails:
        assert result.returncode != 0, result
        assert 'Weights only load failed' in result.output, result
    else:
        assert result.returncode == 0, result
        assert re.search(r'Load checkpoint from .*epoch_2\.pth',
                         result.output)
    assert 'UntrustedCheckpointError' not in result.output, result


def _malicious_checkpoint(path, payload):
    torch.save(dict(meta=dict(epoch=1, iter=2), state_dict={},
                    message_hub=dict(log_scalars={}, runtime_info={},
                                     resumed_keys={}),
                    evil=payload), path)


@pytest.mark.parametrize('payload_cls,name', [
    (ckpt_toys.ExecPayload, 'exec'),
    (ckpt_toys.MarkerPayload, 'tests.engine.ckpt_toys.create_marker')])
def test_malicious_checkpoint_is_refused_in_process(tmp_path, payload_cls,
                                                    name):
    import mmsafe  # noqa: F401
    from mmengine.runner.checkpoint import _load_checkpoint

    from mmsafe.checkpoint import (UntrustedCheckpointError,
                                   explain_refusals,
                                   register_local_weights_only_scheme,
                                   trusted_checkpoint_globals)
    register_local_weights_only_scheme()  # as SafeRunner does
    marker = str(tmp_path / 'pwned')
    path = str(tmp_path / 'evil.pth')
    _malicious_checkpoint(path, payload_cls(marker))
    assert not osp.exists(marker)
    with pytest.raises(UntrustedCheckpointError) as info:
        with trusted_checkpoint_globals(), explain_refusals(path):
            _load_checkpoint(path, map_location='cpu')
    message = str(info.value)
    assert f'`{name}`' in message or f'`builtins.{name}`' in message, message
    if name == 'exec':
        # a builtin is never offered for trust
        assert 'can never be trusted' in message, message
        assert "mmsafe_trusted_globals = ['" not in message, message
    else:
        # a function of a project module this process imported is
        assert f"mmsafe_trusted_globals = ['{name}']" in message, message
        assert f'MMSAFE_TRUSTED_GLOBALS={name}' in message, message
    assert not osp.exists(marker), 'the checkpoint ran code while loading'


def test_malicious_checkpoint_refused_by_resume_and_load_from(trained):
    root, config, _ = trained
    marker = str(root / 'pwned')
    path = str(root / 'evil.pth')
    _malicious_checkpoint(path, ckpt_toys.MarkerPayload(marker))
    for args in (['--resume', path],
                 ['--cfg-options', f'load_from={path}']):
        result = run_train(config, timeout=600, args=[
            '--work-dir', str(root / 'work_evil'), *args])
        assert result.returncode != 0, result
        assert 'UntrustedCheckpointError' in result.output, result
        assert '`tests.engine.ckpt_toys.create_marker`' in result.output
        assert not osp.exists(marker), 'the checkpoint ran code'


def test_explicit_opt_in_by_env_and_config(tmp_path, monkeypatch):
    import mmsafe  # noqa: F401
    from mmengine.config import Config
    from mmengine.runner.checkpoint import _load_checkpoint

    from mmsafe.checkpoint import (UntrustedCheckpointError,
                                   explain_refusals,
                                   register_local_weights_only_scheme,
                                   trusted_checkpoint_globals)
    register_local_weights_only_scheme()  # as SafeRunner does
    path = str(tmp_path / 'noted.pth')
    torch.save(dict(meta=dict(note=ckpt_toys.TrustedNote('hi')),
                    state_dict={}), path)
    name = 'tests.engine.ckpt_toys.TrustedNote'

    def load(cfg=None):
        with trusted_checkpoint_globals(cfg=cfg), explain_refusals(path):
            return _load_checkpoint(path, map_location='cpu')

    with pytest.raises(UntrustedCheckpointError, match=re.escape(name)):
        load()
    cfg = Config(dict(mmsafe_trusted_globals=[name]))
    assert load(cfg)['meta']['note'].text == 'hi'
    # The trust ends with the scope that granted it.
    with pytest.raises(UntrustedCheckpointError):
        load()
    monkeypatch.setenv('MMSAFE_TRUSTED_GLOBALS', name)
    assert load()['meta']['note'].text == 'hi'
    # Code-running builtins can never be opted in.
    monkeypatch.setenv('MMSAFE_TRUSTED_GLOBALS', 'builtins.exec')
    with pytest.raises(ValueError, match='cannot be trusted'):
        load()


def test_getattr_stand_in_only_resolves_history_buffer_statistics():
    import mmsafe  # noqa: F401
    from mmsafe.checkpoint import UntrustedCheckpointError
    from mmsafe.checkpoint.history_buffer import (HistoryBufferObjects,
                                                  StatisticsMethod)
    from mmsafe.checkpoint.tokens import Token
    objects = HistoryBufferObjects(lambda obj, build: None)
    resolved = objects.getattr((objects.token, 'mean'))
    assert type(resolved) is StatisticsMethod and resolved.name == 'mean'
    for owner, name in ((objects.token, '__init__'),
                        (objects.token, 'update'),
                        (Token('posix'), 'system'), (os, 'system'),
                        (torch, 'load')):
        with pytest.raises(UntrustedCheckpointError):
            objects.getattr((owner, name))
    assert not os.environ.get('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD')


@pytest.mark.parametrize('amp', [False, True])
def test_mmsafe_optim_wrapper_state_resumes(tmp_path, amp):
    """mmsafe's own NaN-skip wrappers (GradScaler state under AMP) keep
    their checkpoints inside the allowlist."""
    from tests.engine.ckpt_toys_cfg import TOY_CONFIG
    text = TOY_CONFIG.format(max_epochs=1, max_keep=-1, custom_hooks='[]')
    text = text.replace('optim_wrapper = dict(',
                        "optim_wrapper = dict(type='NaNSkipOptimWrapper', ")
    config = write_config(str(tmp_path / 'toy.py'), text)
    work_dir = str(tmp_path / 'work')
    args = ['--work-dir', work_dir] + (['--amp'] if amp else [])
    result = run_train(config, timeout=300, args=args)
    assert result.returncode == 0, result
    result = run_train(config, timeout=300, args=args + [
        '--resume', '--cfg-options', 'train_cfg.max_epochs=2'])
    assert result.returncode == 0, result
    assert 'resumed epoch: 1, iter: 4' in result.output, result
    wrapper = 'AmpNaNSkipOptimWrapper' if amp else 'NaNSkipOptimWrapper'
    assert f"type='{wrapper}'" in result.output
    assert 'Epoch(train) [2][4/4]' in result.output, result


def test_config_opt_in_through_train_py(tmp_path):
    """A checkpoint with a project's own object: auto-resume refuses it,
    naming the object; `mmsafe_trusted_globals` in the config lets it
    load, with weights_only still on."""
    from tests.engine.ckpt_toys_cfg import TOY_CONFIG
    config = write_config(str(tmp_path / 'toy.py'), TOY_CONFIG.format(
        max_epochs=1, max_keep=-1,
        custom_hooks="[dict(type='NoteInCheckpointHook')]"))
    work_dir = str(tmp_path / 'work')
    result = run_train(config, timeout=300, args=['--work-dir', work_dir])
    assert result.returncode == 0, result
    resume = ['--work-dir', work_dir, '--resume', '--cfg-options',
              'train_cfg.max_epochs=2']
    result = run_train(config, timeout=300, args=resume)
    assert result.returncode != 0, result
    assert 'UntrustedCheckpointError' in result.output, result
    assert '`tests.engine.ckpt_toys.TrustedNote`' in result.output
    result = run_train(config, timeout=300, args=resume + [
        "mmsafe_trusted_globals=['tests.engine.ckpt_toys.TrustedNote']"])
    assert result.returncode == 0, result
    assert 'checkpoint note: iter 4' in result.output, result
    assert 'Epoch(train) [2][4/4]' in result.output, result

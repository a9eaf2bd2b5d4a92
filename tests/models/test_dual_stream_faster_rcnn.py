import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.structures import InstanceData

from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import HorizontalBoxes

import mmsafe  # noqa: F401
from tests.utils import REPO_ROOT

TINY = osp.join(REPO_ROOT, 'configs', '_base_', 'models',
                'dual_faster_rcnn_r18w16_fpn_tiny.py')
R50 = osp.join(REPO_ROOT, 'configs', '_base_', 'models',
               'dual_faster_rcnn_r50_fpn.py')
#: The tiny model config as it was when it repeated the R50 recipe in full.
TINY_SNAPSHOT = osp.join(osp.dirname(__file__), 'snapshots',
                         'tiny_model_cfg.json')
MMDET_KEYS = {'loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_bbox', 'acc'}


def _build(**overrides):
    cfg = Config.fromfile(TINY).model
    for key, value in overrides.items():
        cfg[key] = value
    torch.manual_seed(0)
    model = MODELS.build(cfg)
    model.init_weights()
    return model


def _data(boxes_per_image, size=(64, 96)):
    """A paired batch as pseudo_collate gives it: uint8 images and samples
    with boxes (an empty list: no GT)."""
    h, w = size
    g = torch.Generator().manual_seed(3)
    vis, ir, samples = [], [], []
    for i, boxes in enumerate(boxes_per_image):
        vis.append(torch.randint(0, 256, (3, h, w), generator=g,
                                 dtype=torch.uint8))
        ir.append(torch.randint(0, 256, (3, h, w), generator=g,
                                dtype=torch.uint8))
        sample = DetDataSample(metainfo=dict(
            img_id=str(i), img_path=f'visible/{i}.jpg',
            ir_img_path=f'infrared/{i}.jpg', ori_shape=(h, w),
            img_shape=(h, w), scale_factor=(1., 1.), flip=False,
            flip_direction=None))
        b = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
        sample.gt_instances = InstanceData(
            bboxes=HorizontalBoxes(b),
            labels=torch.zeros(len(b), dtype=torch.long))
        sample.ignored_instances = InstanceData(
            bboxes=HorizontalBoxes(torch.zeros((0, 4))),
            labels=torch.zeros((0, ), dtype=torch.long))
        samples.append(sample)
    return dict(inputs=dict(visible=vis, infrared=ir), data_samples=samples)


def _loss(model, data):
    data = model.data_preprocessor(data, training=True)
    return model(**data, mode='loss')


def _backward_and_check_grads(model, losses):
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in model.named_parameters()
               if p.requires_grad and p.grad is None]
    # Every trainable parameter is in the graph (DDP without
    # find_unused_parameters relies on it).
    assert not missing, missing


def test_loss_keys_with_gt():
    model = _build()
    model.train()
    losses = _loss(model, _data([[[10, 8, 20, 40]], [[40, 5, 60, 50],
                                                    [5, 5, 15, 30]]]))
    assert MMDET_KEYS | {'loss_macl'} <= set(losses)
    assert losses['loss_macl'].item() > 0
    assert model.macl_head.last_num_pairs == 2
    # 'loss' must not be summed twice by parse_losses: no aggregate key.
    assert not any(k.startswith('loss_total') for k in losses)
    _backward_and_check_grads(model, losses)


def test_loss_keys_with_no_gt_in_the_whole_batch():
    model = _build()
    model.train()
    losses = _loss(model, _data([[], [], []]))
    assert MMDET_KEYS | {'loss_macl'} <= set(losses)
    for key in ('loss_bbox', 'loss_rpn_bbox'):
        value = losses[key]
        value = sum(value) if isinstance(value, list) else value
        assert value.item() == 0
    _backward_and_check_grads(model, losses)


def test_no_macl_head_no_macl_key():
    model = _build(macl_head=None)
    model.train()
    losses = _loss(model, _data([[[10, 8, 20, 40]], []]))
    assert 'loss_macl' not in losses and MMDET_KEYS <= set(losses)


def test_batch_of_one_keeps_loss_macl_connected():
    model = _build()
    model.train()
    losses = _loss(model, _data([[[10, 8, 20, 40]]]))
    assert losses['loss_macl'].item() == 0
    _backward_and_check_grads(model, losses)
    for name, p in model.macl_head.named_parameters():
        assert p.grad is not None, name


def test_predict_on_pairs():
    model = _build()
    model.eval()
    data = _data([[[10, 8, 20, 40]], []], size=(50, 70))
    with torch.no_grad():
        data = model.data_preprocessor(data, training=False)
        assert data['inputs']['visible'].shape == (2, 3, 64, 96)
        results = model(**data, mode='predict')
    assert len(results) == 2
    for result in results:
        pred = result.pred_instances
        assert pred.bboxes.shape[1] == 4
        assert len(pred.bboxes) == len(pred.scores) == len(pred.labels)
        if len(pred.bboxes):
            # rescaled to the original image
            assert pred.bboxes[:, 2].max() <= 70 + 1e-3
    with torch.no_grad():
        feats = model(**data, mode='tensor')
    assert isinstance(feats, tuple)


def test_shared_vs_separate_backbone_weights():
    separate = _build()
    assert not separate.shares_backbone
    shared = _build(ir_backbone=None, ir_neck=None)
    assert shared.shares_backbone and shared.ir_neck is None
    n_sep = sum(p.numel() for p in separate.parameters())
    n_shared = sum(p.numel() for p in shared.parameters())
    n_backbone = sum(p.numel() for p in separate.ir_backbone.parameters())
    n_neck = sum(p.numel() for p in separate.ir_neck.parameters())
    assert n_sep - n_shared == n_backbone + n_neck

    # Shared: identical visible and infrared inputs give identical stream
    # features; separate weights give different ones.
    img = torch.randn(1, 3, 64, 64)
    for model, same in ((shared, True), (separate, False)):
        model.eval()
        with torch.no_grad():
            vis, ir = model.extract_paired_feat(
                dict(visible=img, infrared=img))
        assert torch.equal(vis[0], ir[0]) is same

    # Shared backbone: the infrared path sends gradient into the (single)
    # backbone too.
    shared.train()
    shared.zero_grad()
    vis, ir = shared.extract_paired_feat(
        dict(visible=torch.zeros(2, 3, 64, 64), infrared=img.repeat(2, 1, 1,
                                                                    1)))
    ir[0].sum().backward()
    assert shared.backbone.conv1.weight.grad.abs().sum() > 0


@pytest.mark.parametrize('fusion', [
    dict(type='ConcatConvFusion'),
    dict(type='AddFusion'),
    dict(type='WeightedAddFusion'),
])
def test_fusion_modules(fusion):
    model = _build(fusion=fusion)
    assert len(model.fusions) == 3
    model.train()
    losses = _loss(model, _data([[[10, 8, 20, 40]], []]))
    _backward_and_check_grads(model, losses)


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match=r'in_dim=1024.*32'):
        _build(macl_head=dict(type='MACLHead', in_dim=1024))
    model = _build()
    with pytest.raises(TypeError, match='visible'):
        model.extract_feat(torch.zeros(1, 3, 32, 32))


def test_concat_conv_fusion_starts_as_mean():
    model = _build()
    channels = model.fusions[0].in_channels
    v, r = (torch.randn(2, channels, 4, 4), torch.randn(2, channels, 4, 4))
    torch.testing.assert_close(model.fusions[0](v, r), (v + r) / 2)


def test_tiny_config_inherits_the_r50_recipe_and_builds_the_same_model():
    cfg = Config.fromfile(TINY)
    with open(TINY) as f:
        text = f.read()
    assert "_base_ = './dual_faster_rcnn_r50_fpn.py'" in text
    # Only the differences are stated: far shorter than the R50 recipe.
    with open(R50) as f:
        assert len(text.splitlines()) < len(f.read().splitlines()) // 2
    built = json.loads(json.dumps(cfg.model.to_dict(), sort_keys=True))
    with open(TINY_SNAPSHOT) as f:
        assert built == json.load(f)
    # The same architecture: parameter names and shapes of the built model.
    model = _build()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes['backbone.conv1.weight'] == (16, 3, 7, 7)
    assert shapes['ir_neck.fpn_convs.2.conv.weight'] == (32, 32, 3, 3)
    assert shapes['roi_head.bbox_head.shared_fcs.1.weight'] == (128, 128)
    assert not any(k.startswith('backbone.layer4') for k in shapes)


def channels_last_weights(model):
    from benchmarks.stage_profile_hook import channels_last_weights
    return channels_last_weights(model)


def test_channels_last_same_weights_as_the_default_layout():
    """A seed gives the same initial weights with either layout (the random
    draws are made in the default layout), the convolutions' weights are
    channels-last, and the default model has none."""
    default, nhwc = _build(), _build(channels_last=True)
    assert channels_last_weights(default)[0] == 0
    converted, total = channels_last_weights(nhwc)
    assert total > 20 and converted == total
    ours = dict(nhwc.named_parameters())
    for name, param in default.named_parameters():
        assert torch.equal(param, ours[name]), name


def test_channels_last_computes_the_same_model():
    """The same features (both streams, every level) up to float rounding
    (the layout changes the convolutions' order of summation, not the
    arithmetic); one SGD step on the same batch gives the same RPN and
    MACL losses (the RoI head's sampled proposals may differ where the
    rounding moves a box across an NMS or sampling tie), and the weights
    stay channels-last; a checkpoint of it loads into a default-layout
    model value for value."""
    import io

    from mmengine.optim import OptimWrapper

    from mmsafe.checkpoint import load_checkpoint_file
    boxes = [[[4, 4, 40, 50]], [[10, 8, 60, 40], [50, 20, 90, 60]]]
    models, logs = [], []
    for channels_last in (False, True):
        model = _build(channels_last=channels_last)
        with torch.no_grad():
            data = model.data_preprocessor(_data(boxes), training=True)
            models.append(model.extract_paired_feat(data['inputs']))
        model.train()
        wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01,
                                               momentum=0.9))
        torch.manual_seed(1)
        logs.append(model.train_step(_data(boxes), wrapper))
    for default_feats, nhwc_feats in zip(*models):
        for default, nhwc in zip(default_feats, nhwc_feats):
            torch.testing.assert_close(nhwc, default, rtol=1e-4, atol=1e-5)
    assert set(logs[0]) == set(logs[1])
    for key in ('loss_rpn_cls', 'loss_rpn_bbox', 'loss_macl'):
        torch.testing.assert_close(logs[1][key], logs[0][key], rtol=1e-4,
                                   atol=1e-6, msg=key)
    assert all(torch.isfinite(v).all() for v in logs[1].values())
    converted, total = channels_last_weights(model)
    assert converted == total > 20
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = load_checkpoint_file(buffer)
    fresh = _build()
    fresh.load_state_dict(state)
    assert channels_last_weights(fresh)[0] == 0
    ours = dict(model.named_parameters())
    for name, param in fresh.named_parameters():
        assert torch.equal(param, ours[name]), name


@pytest.mark.parametrize('channels_last', [False, True])
def test_a_training_step_makes_no_host_sync_in_mmsafes_model_code(
        channels_last):
    """Neither the dual-stream detector nor the MACL head converts a tensor
    to a Python value on the training path (each conversion is a host sync
    on CUDA); MMDetection's heads do, and are counted, so the counter
    sees the step."""
    from mmengine.optim import OptimWrapper

    from benchmarks.stage_profile_hook import SyncCounter
    model = _build(channels_last=channels_last)
    model.train()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01))
    data = _data([[[4, 4, 40, 50]], [[10, 8, 60, 40], [50, 20, 90, 60]]])
    model.train_step(data, wrapper)  # first step: one-time reads
    counter = SyncCounter(cuda=False)
    counter.install()
    try:
        model.train_step(data, wrapper)
    finally:
        counter.remove()
    ours = {site: n for site, n in counter.conversions.items()
            if ' @ model (mmsafe)' in site or '(via model (mmsafe))' in site}
    assert ours == {}
    assert any(' @ model (MMDetection)' in site
               for site in counter.conversions), counter.conversions

"""CPU autocast without patching mmcv.

DualStreamFasterRCNN runs its streams under autocast and its RPN/RoI heads
(the users of mmcv's float32-only CPU kernels) in float32 with autocast
disabled; a model that hands half-precision tensors to an mmcv op fails
with AmpNaNSkipOptimWrapper's error naming the op and the fix."""
import importlib
import inspect

import pytest
import torch
import torch.nn as nn
from mmcv.ops import RoIAlign, nms
from mmengine.logging import MessageHub
from mmengine.model import BaseModel

from mmsafe.compat import autocast_enabled
from mmsafe.engine.optimizers import (AmpNaNSkipOptimWrapper,
                                      NaNSkipOptimWrapper)
from tests.models.test_dual_stream_faster_rcnn import _build, _data
from tests.utils import skip_without_autocast

BOXES = [[[10, 8, 20, 40]], [[40, 5, 60, 50], [5, 5, 15, 30]]]


@pytest.fixture(autouse=True)
def message_hub():
    MessageHub.get_instance('test_cpu_autocast').update_info('iter', 0)


def _amp(model, dtype):
    return AmpNaNSkipOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        dtype=dtype, device_type='cpu')


def _mmcv_untouched():
    nms_module = importlib.import_module('mmcv.ops.nms')
    roi_align_module = importlib.import_module('mmcv.ops.roi_align')
    for cls, module in ((RoIAlign, roi_align_module),
                        (nms_module.NMSop, nms_module)):
        forward = inspect.getattr_static(cls, 'forward')
        forward = getattr(forward, '__func__', forward)
        assert not hasattr(forward, '__wrapped__'), cls
        assert forward.__code__.co_filename == module.__file__, cls


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_dual_stream_heads_run_in_float32_under_cpu_autocast(dtype):
    skip_without_autocast('cpu', dtype)
    model = _build()
    model.train()
    seen = {}

    def record(name):
        def hook(module, args, output=None):
            # Outputs of the backbone, inputs (the features) of the heads.
            feats = args[0] if output is None else output
            seen[name] = (feats[0].dtype, autocast_enabled('cpu'))
        return hook

    model.backbone.register_forward_hook(record('backbone'))
    model.rpn_head.register_forward_pre_hook(record('rpn_head'))
    model.roi_head.bbox_roi_extractor.register_forward_pre_hook(
        record('roi_extractor'))
    wrapper = _amp(model, dtype)
    log_vars = model.train_step(_data(BOXES), wrapper)
    assert all(torch.isfinite(torch.as_tensor(v)) for v in log_vars.values())
    assert wrapper.counters['steps'] == 1 and wrapper.counters['skipped'] == 0
    half = getattr(torch, dtype)
    assert seen['backbone'] == (half, True)
    assert seen['rpn_head'] == (torch.float32, False)
    assert seen['roi_extractor'] == (torch.float32, False)
    # Inference under CPU autocast (val_cfg fp16) takes the same path.
    model.eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=half):
        data = model.data_preprocessor(_data(BOXES), training=False)
        results = model(**data, mode='predict')
    assert len(results) == 2
    assert results[0].pred_instances.bboxes.dtype == torch.float32
    _mmcv_untouched()


class _RoIToy(BaseModel):
    """A conv, then mmcv's RoIAlign (or NMS) on its output, as a detector
    that does not keep the op in float32 under CPU autocast."""

    def __init__(self, op: str = 'roi_align', fail: str = None):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.roi_align = RoIAlign(2, 1.0, 2)
        self.op, self.fail = op, fail

    def forward(self, inputs, data_samples=None, mode='loss'):
        if self.fail:
            raise RuntimeError(self.fail)
        feat = self.conv(inputs)
        if self.op == 'nms':
            boxes = feat[0, :, 0, :4] + feat.new_tensor([0., 0., 8., 8.])
            nms(boxes, feat[0, :, 1, 0], 0.5)
            return dict(loss=feat.float().mean())
        # Boxes in float32, as proposals are.
        rois = torch.tensor([[0, 1., 1., 6., 6.]])
        return dict(loss=self.roi_align(feat, rois).float().mean())


def _toy_batch():
    return dict(inputs=torch.rand(1, 3, 8, 8))


@pytest.mark.parametrize('op', ['roi_align', 'nms'])
@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_half_tensors_in_an_mmcv_op_get_a_clear_error(op, dtype):
    skip_without_autocast('cpu', dtype)
    model = _RoIToy(op)
    with pytest.raises(RuntimeError) as info:
        model.train_step(_toy_batch(), _amp(model, dtype))
    message = str(info.value)
    assert message.startswith('[mmsafe] AmpNaNSkipOptimWrapper')
    assert f'mmcv op {op} (' in message
    assert str(getattr(torch, dtype)) in message
    assert 'float32 only' in message and 'DualStreamFasterRCNN' in message
    assert "torch.autocast('cpu', enabled=False)" in message
    # The kernel's own error is kept as the cause.
    assert isinstance(info.value.__cause__, (RuntimeError,
                                             NotImplementedError))
    _mmcv_untouched()


def test_other_errors_pass_through_unchanged():
    model = _RoIToy(fail='expected scalar type Float in my own code')
    with pytest.raises(RuntimeError) as info:
        model.train_step(_toy_batch(), _amp(model, 'bfloat16'))
    assert str(info.value) == 'expected scalar type Float in my own code'
    assert info.value.__cause__ is None


def test_the_same_model_trains_in_float32():
    model = _RoIToy()
    wrapper = NaNSkipOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    before = model.conv.weight.detach().clone()
    model.train_step(_toy_batch(), wrapper)
    assert wrapper.counters['steps'] == 1
    assert not torch.equal(before, model.conv.weight)

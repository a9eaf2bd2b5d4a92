import pytest
import torch
from mmengine.structures import InstanceData

from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import HorizontalBoxes

import mmsafe  # noqa: F401


def _sample(h, w, name):
    sample = DetDataSample(metainfo=dict(
        img_path=f'visible/{name}.jpg', ir_img_path=f'infrared/{name}.jpg',
        img_shape=(h, w), ori_shape=(h, w)))
    sample.gt_instances = InstanceData(
        bboxes=HorizontalBoxes(torch.tensor([[1., 2., 5., 9.]])),
        labels=torch.tensor([0]))
    sample.ignored_instances = InstanceData(
        bboxes=HorizontalBoxes(torch.zeros((0, 4))),
        labels=torch.zeros((0, ), dtype=torch.long))
    return sample


def _batch(shapes):
    g = torch.Generator().manual_seed(0)
    vis = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
           for h, w in shapes]
    ir = [torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
          for h, w in shapes]
    samples = [_sample(h, w, str(i)) for i, (h, w) in enumerate(shapes)]
    return dict(inputs=dict(visible=vis, infrared=ir), data_samples=samples)


def _build(**kwargs):
    cfg = dict(
        type='PairedDetDataPreprocessor',
        visible=dict(mean=[10., 20., 30.], std=[2., 4., 5.], bgr_to_rgb=True),
        infrared=dict(mean=[100.], std=[50.], bgr_to_rgb=False),
        pad_size_divisor=8, pad_value=-7)
    cfg.update(kwargs)
    return MODELS.build(cfg)


def test_normalisation_per_modality_and_identical_padding():
    pre = _build()
    data = _batch([(10, 13), (17, 6)])
    raw_vis = [t.clone() for t in data['inputs']['visible']]
    raw_ir = [t.clone() for t in data['inputs']['infrared']]
    out = pre(data, training=False)
    vis, ir = out['inputs']['visible'], out['inputs']['infrared']
    # Output structure: one float tensor per modality, identical shapes,
    # largest H, W rounded up to the divisor.
    assert set(out['inputs']) == {'visible', 'infrared'}
    assert vis.dtype == ir.dtype == torch.float32
    assert vis.shape == ir.shape == (2, 3, 24, 16)

    # Visible: BGR->RGB then its own mean/std.
    exp_vis = (raw_vis[0][[2, 1, 0]].float() -
               torch.tensor([10., 20., 30.]).view(3, 1, 1)) / torch.tensor(
                   [2., 4., 5.]).view(3, 1, 1)
    torch.testing.assert_close(vis[0, :, :10, :13], exp_vis)
    # Infrared: no channel swap, its own single mean/std.
    exp_ir = (raw_ir[1].float() - 100.) / 50.
    torch.testing.assert_close(ir[1, :, :17, :6], exp_ir)

    # Identical padding: same region padded with pad_value in both.
    for t in (vis, ir):
        assert (t[0, :, 10:, :] == -7).all() and (t[0, :, :, 13:] == -7).all()
        assert (t[1, :, 17:, :] == -7).all() and (t[1, :, :, 6:] == -7).all()

    samples = out['data_samples']
    assert [s.batch_input_shape for s in samples] == [(24, 16)] * 2
    assert [s.pad_shape for s in samples] == [(16, 16), (24, 8)]
    # boxtype2tensor, as in DetDataPreprocessor
    assert isinstance(samples[0].gt_instances.bboxes, torch.Tensor)


def test_stacked_inputs_and_default_normalisation():
    pre = MODELS.build(dict(type='PairedDetDataPreprocessor',
                            pad_size_divisor=32))
    vis = torch.full((2, 3, 20, 30), 255, dtype=torch.uint8)
    ir = torch.zeros((2, 3, 20, 30), dtype=torch.uint8)
    out = pre(dict(inputs=dict(visible=vis, infrared=ir), data_samples=None))
    assert out['inputs']['visible'].shape == (2, 3, 32, 32)
    assert out['inputs']['infrared'].shape == (2, 3, 32, 32)
    # Default: ImageNet RGB statistics for both modalities.
    assert torch.isclose(out['inputs']['infrared'][0, 0, 0, 0],
                         torch.tensor(-123.675 / 58.395))


def test_size_mismatch_and_missing_modality_are_errors():
    pre = _build()
    data = _batch([(10, 12)])
    data['inputs']['infrared'] = [torch.zeros((3, 10, 11), dtype=torch.uint8)]
    with pytest.raises(ValueError, match=r'visible/0.jpg.*differ in size'):
        pre(data)
    data = _batch([(10, 12)])
    del data['inputs']['infrared']
    with pytest.raises(KeyError, match='infrared'):
        pre(data)
    with pytest.raises(TypeError, match='PackPairedDetInputs'):
        pre(dict(inputs=[torch.zeros(3, 4, 4)], data_samples=None))


def test_batch_augment_applies_one_geometry_to_both():
    data = _batch([(16, 24), (16, 24)])
    # Make infrared an exact copy of visible before normalisation so that
    # identical geometry can be checked pixel by pixel.
    data['inputs']['infrared'] = [
        t[[2, 1, 0]].clone() for t in data['inputs']['visible']]
    pre = _build(
        visible=dict(mean=[0.], std=[1.], bgr_to_rgb=True),
        infrared=dict(mean=[0.], std=[1.], bgr_to_rgb=False),
        batch_augments=[
            dict(type='BatchResize', scale=(32, 48), pad_size_divisor=16)
        ])
    out = pre(data, training=True)
    vis, ir = out['inputs']['visible'], out['inputs']['infrared']
    assert vis.shape == ir.shape == (2, 3, 32, 48)
    torch.testing.assert_close(vis, ir)
    assert out['data_samples'][0].batch_input_shape == (32, 48)
    # Boxes were scaled once (x2), not once per modality.
    torch.testing.assert_close(out['data_samples'][0].gt_instances.bboxes,
                               torch.tensor([[2., 4., 10., 18.]]))
    # Not applied at test time.
    out = pre(_batch([(16, 24)]), training=False)
    assert out['inputs']['visible'].shape == (1, 3, 16, 24)


class _ThreeChannelOnly(torch.nn.Module):
    """A batch augment that only works on RGB tensors."""

    def forward(self, inputs, data_samples):
        assert inputs.shape[1] == 3
        return inputs, data_samples


def test_batch_augment_that_is_not_pair_safe_is_refused():
    pre = _build()
    pre.batch_augments = torch.nn.ModuleList([_ThreeChannelOnly()])
    with pytest.raises(RuntimeError, match='_ThreeChannelOnly.*pair'):
        pre(_batch([(8, 8), (8, 8)]), training=True)

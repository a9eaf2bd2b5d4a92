"""Every supported geometric transform keeps visible and infrared aligned
(and the boxes follow); photometric transforms touch one modality only."""
import copy
import pickle

import numpy as np
import pytest
from mmcv.transforms import Compose

import mmsafe  # noqa: F401  (registers)
from mmdet.datasets.transforms import RandomFlip
from mmdet.registry import TRANSFORMS
from mmdet.structures.bbox import HorizontalBoxes

H, W = 120, 160
MARKER = (100, 60, 120, 90)  # x1, y1, x2, y2 of the boxed object
MARKER_VALUE, MARKER_THR = 250, 240


def asymmetric_pattern() -> np.ndarray:
    """A gradient (no symmetry axis), an 'L' near the top-left corner and a
    bright boxed marker: any flip, shift or scale mismatch shows."""
    y, x = np.mgrid[0:H, 0:W]
    pattern = (x * 0.8 + y * 0.4).astype(np.float32)
    pattern = (pattern / pattern.max() * 180).astype(np.uint8)
    pattern[10:40, 10:16] = 220
    pattern[34:40, 10:40] = 220
    x1, y1, x2, y2 = MARKER
    pattern[y1:y2, x1:x2] = MARKER_VALUE
    return pattern


def paired_results(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    pattern = asymmetric_pattern()
    # channel 0 carries the same pattern in both modalities; the other
    # channels differ, as real visible and infrared images do
    vis = np.stack(
        [pattern, 255 - pattern,
         rng.integers(0, 255, (H, W), dtype=np.uint8)], -1)
    ir = np.repeat(pattern[..., None], 3, -1)
    return dict(
        img=vis,
        ir_img=ir,
        img_shape=(H, W),
        ori_shape=(H, W),
        img_path='visible/x.png',
        ir_img_path='infrared/x.png',
        gt_bboxes=HorizontalBoxes(np.array([MARKER], np.float32)),
        gt_bboxes_labels=np.array([0]),
        gt_ignore_flags=np.array([False]))


def alignment_errors(out: dict) -> list:
    """What is misaligned in ``out`` (empty list: aligned)."""
    vis, ir = out['img'], out['ir_img']
    if vis.shape[:2] != ir.shape[:2]:
        return [f'sizes differ: {vis.shape[:2]} vs {ir.shape[:2]}']
    errors = []
    if not np.array_equal(vis[..., 0], ir[..., 0]):
        errors.append('pixels differ')
    marker = ir[..., 0] >= MARKER_THR
    boxes = out['gt_bboxes'].numpy() if len(out['gt_bboxes']) else None
    if marker.any():
        if boxes is None:
            errors.append('object visible but its box was dropped')
        else:
            ys, xs = np.nonzero(marker)
            x1, y1, x2, y2 = boxes[0]
            tol = 1.5
            if not (xs.min() >= x1 - tol and xs.max() + 1 <= x2 + tol
                    and ys.min() >= y1 - tol and ys.max() + 1 <= y2 + tol):
                errors.append(f'object pixels x[{xs.min()},{xs.max()}] '
                              f'y[{ys.min()},{ys.max()}] outside box '
                              f'{boxes[0]}')
    return errors


# (transform config, whether it is random)
GEOMETRIC = [
    (dict(type='PairedResize', scale=(100, 70), keep_ratio=False), False),
    (dict(type='PairedResize', scale=(200, 150), keep_ratio=True), False),
    (dict(type='PairedResize', scale_factor=0.5), False),
    (dict(type='PairedFixShapeResize', width=128, height=128,
          keep_ratio=True), False),
    (dict(type='PairedRandomResize', scale=(160, 120),
          ratio_range=(0.5, 1.5), keep_ratio=True), True),
    (dict(type='PairedRandomChoiceResize',
          scales=[(80, 60), (200, 150), (120, 200)], keep_ratio=False), True),
    (dict(type='PairedRandomFlip', prob=0.5), True),
    (dict(type='PairedRandomFlip', prob=0.9,
          direction=['horizontal', 'vertical', 'diagonal']), True),
    (dict(type='PairedRandomCrop', crop_size=(80, 60),
          allow_negative_crop=True), True),
    (dict(type='PairedRandomCrop', crop_size=(0.5, 0.5),
          crop_type='relative_range', allow_negative_crop=True), True),
    (dict(type='PairedPad', size_divisor=32), False),
    (dict(type='PairedPad', size=(200, 160), pad_val=dict(img=7)), False),
    (dict(type='PairedPad', pad_to_square=True), False),
    (dict(type='PairedGeometric', transform=dict(
        type='RandomAffine', max_rotate_degree=20,
        scaling_ratio_range=(0.7, 1.3), max_translate_ratio=0.1,
        max_shear_degree=5)), True),
    (dict(type='PairedGeometric', transform=dict(
        type='RandomShift', prob=1.0, max_shift_px=20)), True),
    (dict(type='PairedGeometric', transform=dict(
        type='Expand', mean=(0, 0, 0), to_rgb=False, ratio_range=(1, 2),
        prob=1.0)), True),
    (dict(type='PairedGeometric', transform=dict(
        type='MinIoURandomCrop', min_ious=(0.1, 0.3, 0.5),
        min_crop_size=0.3)), True),
]


def _id(param):
    cfg = param[0]
    inner = cfg.get('transform', {}).get('type', '')
    return f"{cfg['type']}{'-' + inner if inner else ''}"


@pytest.mark.parametrize('cfg,is_random', GEOMETRIC,
                         ids=[_id(p) for p in GEOMETRIC])
def test_geometric_transform_keeps_pair_aligned(cfg, is_random):
    transform = TRANSFORMS.build(copy.deepcopy(cfg))
    geometries = set()
    for seed in range(12):
        np.random.seed(seed)
        out = transform(paired_results(seed))
        if out is None:  # e.g. a crop without the object: resampled
            continue
        assert alignment_errors(out) == [], (cfg, seed)
        geometries.add(hash(out['ir_img'].tobytes()))
    if is_random:
        # several different draws were exercised, not one lucky one
        assert len(geometries) > 1, geometries


def test_whole_pipeline_keeps_pair_aligned():
    pipeline = Compose([TRANSFORMS.build(copy.deepcopy(c)) for c in [
        dict(type='PairedRandomResize', scale=(160, 120),
             ratio_range=(0.8, 1.25), keep_ratio=True),
        dict(type='PairedRandomCrop', crop_size=(128, 96),
             allow_negative_crop=True),
        dict(type='PairedRandomFlip', prob=0.5),
        dict(type='ModalityTransform', modality='visible',
             transform=dict(type='PhotoMetricDistortion')),
        dict(type='PairedPad', size_divisor=32),
    ]])
    for seed in range(10):
        np.random.seed(seed)
        out = pipeline(paired_results(seed))
        # photometric on visible changes its pixels: compare geometry on the
        # infrared marker vs the boxes and on the sizes
        assert out['img'].shape == out['ir_img'].shape
        errors = [e for e in alignment_errors(out) if e != 'pixels differ']
        assert errors == [], seed


def test_check_detects_independent_flips():
    """Negative control: flipping each modality with its own draw (the bug
    once found in a public fork) is caught by the alignment check."""
    flip = RandomFlip(prob=0.5)
    caught = 0
    for seed in range(12):
        np.random.seed(seed)
        res = paired_results(seed)
        ir = dict(img=res.pop('ir_img'), img_shape=(H, W))
        out = flip(res)
        out['ir_img'] = flip(ir)['img']
        caught += bool(alignment_errors(out))
    assert caught > 0


class _ContentDependent:
    """A transform whose random draws depend on pixel values."""

    def __call__(self, results):
        img = results['img']
        n = 1 if img[..., 1].mean() > img[..., 0].mean() else 2
        np.random.rand(n)
        return results


def test_non_pairable_transform_is_refused():
    transform = TRANSFORMS.build(
        dict(type='PairedGeometric', transform=_ContentDependent()))
    with pytest.raises(RuntimeError, match='different random numbers'):
        transform(paired_results())


def test_paired_transform_refuses_unpaired_results():
    transform = TRANSFORMS.build(dict(type='PairedRandomFlip', prob=1.0))
    res = paired_results()
    del res['ir_img']
    with pytest.raises(KeyError, match='LoadPairedImageFromFile'):
        transform(res)


@pytest.mark.parametrize('modality', ['visible', 'infrared'])
def test_photometric_touches_one_modality(modality):
    transform = TRANSFORMS.build(
        dict(type='ModalityTransform', modality=modality,
             transform=dict(type='PhotoMetricDistortion')))
    key, other = ('img', 'ir_img') if modality == 'visible' else ('ir_img',
                                                                  'img')
    changed = 0
    for seed in range(6):
        np.random.seed(seed)
        res = paired_results(seed)
        before = copy.deepcopy(res)
        out = transform(res)
        assert np.array_equal(out[other], before[other])
        assert out[key].dtype == np.uint8 and out[key].shape == (H, W, 3)
        assert np.array_equal(out['gt_bboxes'].numpy(),
                              before['gt_bboxes'].numpy())
        changed += not np.array_equal(out[key], before[key])
    assert changed > 0


def test_photometric_both_draws_independently():
    transform = TRANSFORMS.build(
        dict(type='ModalityTransform', modality='both',
             transform=dict(type='PhotoMetricDistortion')))
    differ = 0
    for seed in range(6):
        np.random.seed(seed)
        res = paired_results(seed)
        res['img'] = res['ir_img'].copy()  # same content in both
        out = transform(res)
        differ += not np.array_equal(out['img'], out['ir_img'])
    assert differ > 0


def test_geometric_inside_modality_transform_is_refused():
    with pytest.raises(ValueError, match='PairedGeometric'):
        TRANSFORMS.build(
            dict(type='ModalityTransform', modality='infrared',
                 transform=dict(type='Resize', scale=(50, 50))))


class _HiddenFlip:
    """Geometric, but no static check can tell: flips and records
    nothing."""

    def __call__(self, results):
        results['img'] = results['img'][::-1].copy()
        return results


def test_hidden_geometry_inside_modality_transform_is_refused():
    transform = TRANSFORMS.build(
        dict(type='ModalityTransform', modality='infrared',
             transform=_HiddenFlip()))
    with pytest.raises(RuntimeError, match='flipped .vertical.'):
        transform(paired_results())


def test_pack_paired_det_inputs():
    pack = TRANSFORMS.build(dict(type='PackPairedDetInputs'))
    res = paired_results()
    res.update(img_id='x', scale_factor=(1.0, 1.0), flip=False,
               flip_direction=None)
    res['gt_bboxes'] = HorizontalBoxes(
        np.array([MARKER, (1, 1, 5, 5)], np.float32))
    res['gt_bboxes_labels'] = np.array([0, 0])
    res['gt_ignore_flags'] = np.array([False, True])
    vis, ir = res['img'].copy(), res['ir_img'].copy()
    out = pack(res)
    inputs = out['inputs']
    assert set(inputs) == {'visible', 'infrared'}
    for name, arr in (('visible', vis), ('infrared', ir)):
        t = inputs[name]
        assert tuple(t.shape) == (3, H, W) and str(t.dtype) == 'torch.uint8'
        assert np.array_equal(t.permute(1, 2, 0).numpy(), arr)
    sample = out['data_samples']
    for key in ('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                'img_shape', 'scale_factor', 'flip', 'flip_direction'):
        assert key in sample.metainfo, key
    assert sample.ir_img_path == 'infrared/x.png'
    assert len(sample.gt_instances) == 1 and len(sample.ignored_instances) == 1


def test_pack_refuses_size_mismatch():
    pack = TRANSFORMS.build(dict(type='PackPairedDetInputs'))
    res = paired_results()
    res['ir_img'] = res['ir_img'][:, :-1]
    with pytest.raises(ValueError, match='differ in size'):
        pack(res)


def test_transforms_pickle():
    pipeline = Compose([TRANSFORMS.build(copy.deepcopy(c))
                        for c, _ in GEOMETRIC] + [
        TRANSFORMS.build(dict(type='ModalityTransform', modality='infrared',
                              transform=dict(type='PhotoMetricDistortion'))),
        TRANSFORMS.build(dict(type='LoadPairedImageFromFile')),
        TRANSFORMS.build(dict(type='PackPairedDetInputs'))])
    clone = pickle.loads(pickle.dumps(pipeline))
    assert [type(t).__name__ for t in clone.transforms] == [
        type(t).__name__ for t in pipeline.transforms]

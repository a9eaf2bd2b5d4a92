"""The paired pipeline's short paths give exactly what the general path
gives: a resize to the image's own size keeps the array (no cv2.resize
copy), PairedResize / PairedRandomFlip replay the infrared image from the
visible run's record (no second run), the packer converts images with
OpenCV's channel split. Compared field by field, image bytes included,
against the general path (mmcv's resize, two runs through apply_paired,
PackDetInputs' conversion)."""
import copy
import os.path as osp
import random

import numpy as np
import pytest
import torch

import mmsafe  # noqa: F401  (registers)
from mmdet.datasets.transforms import PackDetInputs, RandomFlip, Resize
from mmsafe.registry import DATASETS, TRANSFORMS
from mmdet.structures.bbox import BaseBoxes, HorizontalBoxes
from mmengine.config import Config
from mmsafe.datasets import ensure_synthetic_llvip
from mmsafe.datasets.transforms import apply_paired
from mmsafe.datasets.transforms.geometry_record import same_geometry
from mmsafe.datasets.transforms.loading import three_channels
from mmsafe.compat import numpy_to_tensor
from mmsafe.datasets.transforms.same_size import chw_tensor

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
BASE = osp.join(REPO, 'configs', '_base_', 'datasets', 'llvip.py')
H, W = 48, 64
INTERPOLATIONS = ('nearest', 'bilinear', 'bicubic', 'area', 'lanczos')
DTYPES = (np.uint8, np.uint16, np.int16, np.float32, np.float64)


def assert_same(a, b, where='results'):
    """``a`` and ``b`` equal in type, and for arrays in dtype, shape, bytes
    and C-contiguity."""
    assert type(a) is type(b), f'{where}: {type(a)} vs {type(b)}'
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f'{where}: {a.keys()} vs {b.keys()}'
        for k in a:
            assert_same(a[k], b[k], f'{where}[{k!r}]')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f'{where}[{i}]')
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert a.flags.c_contiguous == b.flags.c_contiguous, where
        assert np.array_equal(a, b), where
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert a.is_contiguous() == b.is_contiguous(), where
        assert torch.equal(a, b), where
    elif isinstance(a, BaseBoxes):
        assert_same(a.tensor, b.tensor, f'{where}.tensor')
    elif hasattr(a, 'to_dict') and hasattr(a, 'metainfo'):  # data samples
        assert_same(dict(a.metainfo), dict(b.metainfo), f'{where}.meta')
        for key in ('gt_instances', 'ignored_instances'):
            x, y = getattr(a, key), getattr(b, key)
            assert_same(dict(x.items()), dict(y.items()), f'{where}.{key}')
    else:
        assert a == b, f'{where}: {a!r} vs {b!r}'


def rng_state():
    return (random.getstate(), np.random.get_state()[1].tolist(),
            torch.get_rng_state())


def image(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random(shape) * 200).astype(dtype)


def pair(vis, ir, boxes=((5, 4, 30, 40), (50, 30, 70, 50))):
    """Paired results; the second box crosses the right border."""
    return dict(img=vis, ir_img=ir, img_shape=vis.shape[:2],
                ori_shape=vis.shape[:2], img_path='v.jpg',
                ir_img_path='i.jpg',
                gt_bboxes=HorizontalBoxes(np.array(boxes, np.float32)),
                gt_bboxes_labels=np.array([0, 0]),
                gt_ignore_flags=np.array([False, False]))


def two_runs(plain, name):
    """The general path: ``plain`` run on each modality by apply_paired
    (one random draw, rewound), as the paired transforms ran before their
    replay."""
    return lambda results: apply_paired(plain.transform, results, name)


# ---------------------------------------------------------------- resize
@pytest.mark.parametrize('interpolation', INTERPOLATIONS)
@pytest.mark.parametrize('dtype', DTYPES)
def test_same_size_resize_keeps_the_image(interpolation, dtype):
    """PairedResize and DecodeAwareResize to the image's own size (scale
    as the size, or a keep_ratio scale the image already fits) keep the
    array, with every field mmdet's Resize (cv2.resize) writes."""
    for channels in (None, 2, 3, 4):
        shape = (H, W) if channels is None else (H, W, channels)
        for scale, keep_ratio in (((W, H), True), ((W, H), False),
                                  ((W * 3, H), True)):
            kw = dict(scale=scale, keep_ratio=keep_ratio,
                      interpolation=interpolation)
            vis, ir = image(shape, dtype, 1), image(shape, dtype, 2)
            fast = TRANSFORMS.build(dict(type='PairedResize', **kw))
            out = fast(pair(vis, ir))
            assert out['img'] is vis and out['ir_img'] is ir
            ref = two_runs(Resize(**kw), 'PairedResize')(
                pair(vis.copy(), ir.copy()))
            assert ref['img'] is not vis
            assert_same(out, ref)
            assert out['scale_factor'] == (1.0, 1.0)
            # boxes still clipped to the image, as Resize does
            assert out['gt_bboxes'].tensor[1, 2] == W
            single = TRANSFORMS.build(dict(type='DecodeAwareResize', **kw))
            one = single(dict(img=vis, img_shape=(H, W)))
            assert one['img'] is vis
            assert_same(one, Resize(**kw)(dict(img=vis.copy(),
                                               img_shape=(H, W))))


@pytest.mark.parametrize('case', [
    'one_channel', 'not_contiguous', 'pillow', 'other_size', 'float16'])
def test_resize_outside_the_shortcut_is_mmcv_resize(case):
    """Arrays OpenCV would not copy as they are, the pillow backend and a
    real resize take mmcv's resize: same output as Resize, a new array."""
    kw = dict(scale=(W, H), keep_ratio=True)
    vis, ir = image((H, W, 3), np.uint8, 1), image((H, W, 3), np.uint8, 2)
    if case == 'one_channel':
        vis, ir = vis[..., :1].copy(), ir[..., :1].copy()
    elif case == 'not_contiguous':
        vis, ir = vis[:, ::-1], ir[:, ::-1]
    elif case == 'pillow':
        kw['backend'] = 'pillow'
    elif case == 'other_size':
        kw['scale'] = (W // 2, H // 2)
    else:
        vis, ir = vis.astype(np.float16), ir.astype(np.float16)
    try:
        ref = two_runs(Resize(**kw), 'PairedResize')(
            pair(vis.copy(), ir.copy()))
    except Exception as e:  # cv2 refuses float16: so must the shortcut
        with pytest.raises(type(e)):
            TRANSFORMS.build(dict(type='PairedResize', **kw))(pair(vis, ir))
        return
    out = TRANSFORMS.build(dict(type='PairedResize', **kw))(pair(vis, ir))
    assert out['img'] is not vis and out['ir_img'] is not ir
    assert_same(out, ref)


# ---------------------------------------------------------------- replay
RESIZES = [dict(scale=(W, H), keep_ratio=True),
           dict(scale=(W // 2, H // 2), keep_ratio=True),
           dict(scale=(100, 30), keep_ratio=False),
           dict(scale=(W * 2, H * 2), keep_ratio=True,
                interpolation='bicubic'),
           dict(scale_factor=0.75, keep_ratio=True)]
FLIPS = [dict(prob=0.5),
         dict(prob=[0.3, 0.3, 0.3],
              direction=['horizontal', 'vertical', 'diagonal'])]


@pytest.mark.parametrize('kind,kw', [('Resize', k) for k in RESIZES] +
                         [('RandomFlip', k) for k in FLIPS])
def test_replay_equals_two_runs(kind, kw):
    """One run + replay leaves results, images and random state exactly as
    the two runs with a rewound draw do (an infrared image of another
    channel count and dtype included)."""
    plain = Resize(**kw) if kind == 'Resize' else RandomFlip(**kw)
    fast = TRANSFORMS.build(dict(type=f'Paired{kind}', **kw))
    directions = set()
    for seed in range(12):
        vis = image((H, W, 3), np.uint8, seed)
        ir = image((H, W, 3), np.uint8, seed + 100)
        if seed % 3 == 2:
            ir = image((H, W, 4), np.float32, seed)
        np.random.seed(seed)
        random.seed(seed)
        out = fast(pair(vis, ir))
        after_fast = rng_state()
        np.random.seed(seed)
        random.seed(seed)
        ref = two_runs(plain, f'Paired{kind}')(pair(vis.copy(), ir.copy()))
        assert_same(rng_state(), after_fast, 'random state')
        assert_same(out, ref)
        directions.add(out.get('flip_direction'))
    if kind == 'RandomFlip':  # flipped and not, every direction drawn
        assert None in directions and len(directions) == (
            4 if isinstance(kw['prob'], list) else 2), directions


def test_replay_falls_back_to_two_runs_when_sizes_differ():
    """A pair of two sizes takes the two runs, which refuse it by name (a
    replay from the visible record would hide the mismatch)."""
    vis = image((H, W, 3), np.uint8)
    ir = image((H + 8, W, 3), np.uint8)
    for keep_ratio in (True, False):
        resize = TRANSFORMS.build(dict(
            type='PairedResize', scale=(W // 2, H // 2),
            keep_ratio=keep_ratio))
        with pytest.raises(RuntimeError, match='PairedResize gave different'):
            resize(pair(vis, ir))


def test_subclass_without_its_own_replay_runs_twice():
    """A subclass may change what the transform does to an image: it takes
    the two runs unless it defines its own replay."""
    calls = []

    class CountingFlip(TRANSFORMS.get('PairedRandomFlip')):

        def _flip(self, results):
            calls.append(results['img'].shape)
            super()._flip(results)

    class CountingFlipWithReplay(CountingFlip):
        replay_infrared = CountingFlip.replay_infrared

    vis, ir = image((H, W, 3), np.uint8), image((H, W, 4), np.uint8)
    two = CountingFlip(prob=1.0)(pair(vis, ir))
    assert calls == [(H, W, 3), (H, W, 4)]
    calls.clear()
    one = CountingFlipWithReplay(prob=1.0)(pair(vis, ir))
    assert calls == [(H, W, 3)]
    assert one.pop('pair_geometry_log') == [('CountingFlipWithReplay',
                                             'both')]
    assert two.pop('pair_geometry_log') == [('CountingFlip', 'both')]
    assert_same(one, two)


# ------------------------------------------------------------------ pack
def packed_the_old_way(img):
    """PackDetInputs' conversion of ``img`` (``torch.from_numpy``; on a
    torch without uint16 tensors, its exact widening to int32)."""
    if img.ndim < 3:
        img = np.expand_dims(img, -1)
    if not img.flags.c_contiguous:
        return numpy_to_tensor(np.ascontiguousarray(img.transpose(2, 0, 1)))
    return numpy_to_tensor(img).permute(2, 0, 1).contiguous()


@pytest.mark.parametrize('dtype', DTYPES + (np.int32, np.int8, bool))
def test_chw_tensor_equals_pack_det_inputs(dtype):
    """Every channel count, flip view and strided view: the tensor
    PackDetInputs makes (dtype, shape, contiguity, values)."""
    for shape in ((H, W), (H, W, 1), (H, W, 2), (H, W, 3), (H, W, 4),
                  (H, W, 6)):
        a = image(shape, dtype)
        views = [a, a[:, ::-1], a[::-1], a[::-1, ::-1], a[:, ::2],
                 a[..., ::-1]]
        for view in views:
            where = f'{dtype} {shape} strides {view.strides}'
            try:
                old = packed_the_old_way(view)
            except ValueError:  # torch refuses a negative stride
                with pytest.raises(ValueError):
                    chw_tensor(view)
                continue
            assert_same(chw_tensor(view), old, where)


@pytest.mark.parametrize('dtype', DTYPES + (np.int32, bool))
def test_three_channels_equals_numpy_repeat(dtype):
    """A grey image as 3 channels: what ``np.repeat`` gives (dtype, shape,
    contiguity, values), contiguous or strided."""
    a = image((H, W), dtype)
    for view in (a, a[:, ::-1], a[::2], np.zeros((0, W), dtype)):
        assert_same(three_channels(view),
                    np.repeat(view[..., None], 3, axis=2),
                    f'{dtype} strides {view.strides}')
        assert three_channels(view).flags.c_contiguous


# ------------------------------------------------------------- geometry
def test_same_geometry_shortcut_agrees_with_allclose():
    eye = np.eye(3)
    cases = [(eye, eye.astype(np.float32)), (eye, eye + 1e-7),
             (eye, eye + 1e-3), (eye, np.full((3, 3), np.nan)),
             (eye * 1e6, eye * 1e6 + 50), (eye * 1e6, eye * 1e6 + 500)]
    for a, b in cases:
        scale = max(1.0, float(np.abs(a).max()), float(np.abs(b).max()))
        assert same_geometry(a, b) == bool(
            np.allclose(a, b, rtol=0, atol=1e-4 * scale))


# ------------------------------------------------- the LLVIP recipe, whole
@pytest.fixture(scope='module')
def llvip_jpegs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('llvip_short') / 'llvip')
    return ensure_synthetic_llvip(
        root, num_train=3, num_test=1, img_size=(1280, 1024), seed=3,
        max_people=4, empty_ratio=0.0, person_height=(60, 500))


@pytest.mark.parametrize('reduced', [True, False])
def test_recipe_pipeline_equals_general_path(llvip_jpegs, reduced):
    """The LLVIP recipe's train pipeline (reduced decode on and off): the
    results before packing (images, boxes, scale_factor, img_shape,
    ori_shape, flip, both geometry records and the step log) and the
    packed sample equal those of the general path (two runs per paired
    step, mmcv's resize, PackDetInputs' conversion), sample by sample,
    flipped and not."""
    cfg = Config.fromfile(BASE)
    pipeline = copy.deepcopy(cfg.train_pipeline)
    names = [p['type'] for p in pipeline]
    assert names == ['LoadPairedImageFromFile', 'LoadAnnotations',
                     'PairedResize', 'PairedRandomFlip',
                     'PackPairedDetInputs', 'KeepFreedMemory']
    # the last step returns the packed sample as it is (it sets the
    # allocator of the process, tested in test_keep_freed_memory.py)
    pipeline = pipeline[:-1]
    if not reduced:
        pipeline[0]['reduced_decode'] = None
    ds = DATASETS.build(dict(
        type='LLVIPDataset', data_root=llvip_jpegs, filter_cfg=None,
        data_prefix=dict(img='visible/train/', ir_img='infrared/train/',
                         ann='Annotations/'), pipeline=pipeline))
    load, annotations, resize, flip, pack = ds.pipeline.transforms
    resize_kw, flip_kw = pipeline[2], pipeline[3]
    general = [
        two_runs(Resize(scale=resize_kw['scale'],
                        keep_ratio=resize_kw['keep_ratio']), 'PairedResize'),
        two_runs(RandomFlip(prob=flip_kw['prob']), 'PairedRandomFlip')
    ]
    flips = set()
    for i in range(len(ds)):
        for seed in range(3):
            np.random.seed(seed)
            fast = ds.get_data_info(i)
            for t in (load, annotations, resize, flip):
                fast = t(fast)
            np.random.seed(seed)
            ref = annotations(load(ds.get_data_info(i)))
            for t in general:
                ref = t(ref)
            assert_same(fast, ref, f'sample {i} seed {seed}')
            flips.add(fast['flip'])
            assert fast['ori_shape'] == (1024, 1280)
            assert fast['img_shape'] == (512, 640)
            old = PackDetInputs(meta_keys=pack.meta_keys).transform(
                copy.copy(ref))
            old['inputs'] = dict(visible=old['inputs'],
                                 infrared=packed_the_old_way(ref['ir_img']))
            assert_same(pack(fast), old, f'packed sample {i} seed {seed}')
            np.random.seed(seed)
            assert_same(ds[i], old, f'dataset sample {i} seed {seed}')
    assert flips == {True, False}

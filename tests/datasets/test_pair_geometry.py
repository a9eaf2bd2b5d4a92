"""Geometry is tracked per modality: a geometric (or mix) transform acting on
one modality only is refused when the dataset is built, at run time as the
backstop, and by PackPairedDetInputs; a healthy pipeline is unchanged,
pixel for pixel and draw for draw."""
import copy
import os.path as osp
import random

import numpy as np
import pytest
import torch
from mmcv.transforms import BaseTransform, Compose
from mmengine.config import Config

import mmsafe  # noqa: F401  (registers)
from mmdet.registry import DATASETS, TRANSFORMS
from mmsafe.datasets.pipeline_check import config_pipeline_problems
from mmsafe.datasets.transforms import PairedCompose, PairGeometryError
from tests.datasets.test_paired_transforms import (H, W, alignment_errors,
                                                   paired_results)
from tests.utils import REPO_ROOT

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
SYNTHETIC = dict(num_train=8, num_test=4, img_size=(96, 80), seed=0)


@pytest.fixture(scope='module')
def demo_root(tmp_path_factory):
    from mmsafe.datasets.synthetic_llvip import ensure_synthetic_llvip
    root = str(tmp_path_factory.mktemp('demo') / 'llvip') + '/'
    ensure_synthetic_llvip(root, **SYNTHETIC)
    return root


def demo_train_dataset_cfg(root, step=None):
    """The demo's train dataset config on a small tree; ``step`` replaces
    its PairedRandomFlip (pipeline[3])."""
    cfg = Config.fromfile(DEMO)
    ds = copy.deepcopy(cfg.train_dataloader.dataset)
    ds.data_root = root
    ds.synthetic = None
    if step is not None:
        assert ds.pipeline[3]['type'] == 'PairedRandomFlip'
        ds.pipeline[3] = step
    return ds


# ------------------------------------------------------ the faults
FAULTS = [
    (dict(type='RandomFlip', prob=0.5), 'PairedRandomFlip'),
    (dict(type='ModalityTransform', modality='visible',
          transform=dict(type='RandomFlip', prob=1.0)), 'PairedRandomFlip'),
    (dict(type='Resize', scale=(64, 48), keep_ratio=True), 'PairedResize'),
    (dict(type='RandomCrop', crop_size=(40, 40)), 'PairedRandomCrop'),
    (dict(type='RandomAffine'), 'PairedGeometric'),
    (dict(type='Pad', size_divisor=32), 'PairedPad'),
    (dict(type='ModalityTransform', modality='infrared',
          transform=dict(type='Expand', mean=(0, 0, 0))), 'PairedGeometric'),
    (dict(type='RandomApply', transforms=[dict(type='RandomShift')]),
     'PairedGeometric'),
    (dict(type='RandomChoice', transforms=[
        [dict(type='PhotoMetricDistortion')],
        [dict(type='RandomFlip', prob=1.0)]]), 'PairedGeometric'),
]


@pytest.mark.parametrize('step,fix', FAULTS,
                         ids=[f"{s['type']}-{i}" for i, (s, _) in
                              enumerate(FAULTS)])
def test_one_modality_geometry_refused_at_dataset_build(demo_root, step,
                                                        fix):
    """Built through the demo config as training builds it: refused before
    any sample is loaded, naming the transform and the paired fix."""
    cfg = demo_train_dataset_cfg(demo_root, step)
    with pytest.raises(ValueError) as info:
        DATASETS.build(cfg)
    message = str(info.value)
    # ModalityTransform refuses when it is built (before the dataset's
    # check, which would name the position)
    where = 'ModalityTransform' if step['type'] == 'ModalityTransform' \
        else 'pipeline[3]'
    assert where in message and fix in message, message
    assert 'line up' in message, message
    # the same from the config alone (preflight, check_dataset)
    problems = config_pipeline_problems(cfg, 'train_dataloader.dataset')
    assert len(problems) == 1 and fix in problems[0], problems
    assert 'train_dataloader.dataset.pipeline[3]' in problems[0]


MIX = [
    dict(type='Mosaic', img_scale=(96, 80)),
    dict(type='MixUp', img_scale=(96, 80)),
    dict(type='CachedMosaic', img_scale=(96, 80)),
    dict(type='CachedMixUp', img_scale=(96, 80)),
    dict(type='CopyPaste'),
]


@pytest.mark.parametrize('mix', MIX, ids=[m['type'] for m in MIX])
def test_mix_transforms_on_one_modality_refused(demo_root, mix):
    steps = [mix, dict(type='ModalityTransform', modality='visible',
                       transform=mix)]
    if mix['type'] not in ('Mosaic', 'MixUp'):  # no paired version
        steps.append(dict(type='PairedGeometric', transform=mix))
    for step in steps:
        with pytest.raises(ValueError, match='mix') as info:
            DATASETS.build(demo_train_dataset_cfg(demo_root, step))
        assert "transform=dict(type='Mosaic'" in str(info.value)


def mix_tree(root, num=6, size=(64, 48)):
    """LLVIP tree whose infrared image is exactly the grey visible image
    (png): wherever the pair lines up, infrared == grey(visible)."""
    import cv2
    from tests.datasets.tree import write_img
    rng = np.random.default_rng(0)
    specs = {}
    for i in range(num):
        stem = f'{i + 1:06d}'
        vis = cv2.GaussianBlur(
            rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8),
            (0, 0), 1.5)
        grey = cv2.cvtColor(vis, cv2.COLOR_BGR2GRAY)
        write_img(osp.join(root, 'visible/train', stem + '.png'), vis)
        write_img(osp.join(root, 'infrared/train', stem + '.png'),
                  cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR))
        specs[stem] = size
    import os
    os.makedirs(osp.join(root, 'Annotations'), exist_ok=True)
    from tests.datasets.tree import voc_xml
    for stem, (w, h) in specs.items():
        with open(osp.join(root, 'Annotations', stem + '.xml'), 'w') as f:
            f.write(voc_xml(stem + '.png', w, h,
                            [('person', (10, 8, 40, 40), 0)]))
    return root


@pytest.mark.parametrize('mix', [
    dict(type='Mosaic', img_scale=(64, 48), prob=1.0),
    dict(type='MixUp', img_scale=(64, 48), ratio_range=(0.8, 1.6),
         pad_val=114.0),
], ids=['Mosaic', 'MixUp'])
def test_paired_mosaic_and_mixup_mix_the_partners(tmp_path, mix):
    """PairedGeometric(Mosaic / MixUp) in MultiImageMixDataset: the
    infrared tiles come from the same partners with the same placement;
    the plain transform leaves the infrared image unmixed (the fault)."""
    import cv2
    root = mix_tree(str(tmp_path / 'llvip'))

    def build(step):
        return DATASETS.build(dict(
            type='MultiImageMixDataset',
            dataset=dict(
                type='LLVIPDataset', data_root=root + '/',
                data_prefix=dict(img='visible/train/', ann='Annotations/'),
                img_suffixes=('.png', ), filter_cfg=None,
                pipeline=[dict(type='LoadPairedImageFromFile'),
                          dict(type='LoadAnnotations', with_bbox=True)]),
            pipeline=[step]))

    def mismatch(out):
        grey = cv2.cvtColor(out['img'], cv2.COLOR_BGR2GRAY).astype(int)
        return np.abs(grey - out['ir_img'][..., 0].astype(int)).max()

    if mix['type'] == 'Mosaic':
        # the plain Mosaic changes the visible size only: packing refuses
        packed = build(mix)
        packed.pipeline.append(TRANSFORMS.build(
            dict(type='PackPairedDetInputs')))
        packed.pipeline_types.append('PackPairedDetInputs')
        with pytest.raises(ValueError, match='differ in size'):
            packed[0]
    paired = build(dict(type='PairedGeometric', transform=mix))
    plain = build(mix)
    mixed = 0
    for idx in range(6):
        random.seed(idx)
        np.random.seed(idx)
        out = paired[idx]
        assert out['img'].shape[:2] == out['ir_img'].shape[:2]
        # grey of a mixed visible == the mixed infrared (up to rounding of
        # the resize and the blend)
        assert mismatch(out) <= 3, idx
        random.seed(idx)
        np.random.seed(idx)
        bad = plain[idx]
        if bad['img'].shape[:2] == bad['ir_img'].shape[:2]:
            mixed += mismatch(bad) > 3
        else:
            mixed += 1
    assert mixed > 0  # the plain transform really breaks the pair


def test_mix_transform_in_a_wrapper_is_found_from_the_config(demo_root):
    """MultiImageMixDataset's own pipeline mixes the paired samples: the
    static check looks into the wrapper's pipeline."""
    inner = demo_train_dataset_cfg(demo_root)
    inner.pipeline = inner.pipeline[:2]
    wrapper = dict(type='MultiImageMixDataset', dataset=inner, pipeline=[
        dict(type='Mosaic', img_scale=(96, 80)),
        dict(type='PairedRandomFlip', prob=0.5),
        dict(type='PackPairedDetInputs')])
    problems = config_pipeline_problems(wrapper, 'train_dataloader.dataset')
    assert len(problems) == 1, problems
    assert 'train_dataloader.dataset.pipeline[0] Mosaic' in problems[0]
    assert "dict(type='PairedGeometric', transform=dict(type='Mosaic'" in \
        problems[0]
    wrapper['pipeline'][0] = dict(type='PairedGeometric',
                                  transform=wrapper['pipeline'][0])
    assert config_pipeline_problems(wrapper) == []


def test_photometric_on_one_modality_stays_allowed(demo_root):
    step = dict(type='ModalityTransform', modality='visible',
                transform=dict(type='PhotoMetricDistortion'))
    ds = DATASETS.build(demo_train_dataset_cfg(demo_root, step))
    np.random.seed(0)
    out = ds[0]
    assert out['inputs']['visible'].shape == out['inputs']['infrared'].shape
    assert config_pipeline_problems(demo_train_dataset_cfg(
        demo_root, step)) == []


# ------------------------------------------------------- run-time backstop
@TRANSFORMS.register_module(force=True)
class VisibleOnlyFlip(BaseTransform):
    """A user's transform that flips ``img`` (and boxes) and records
    nothing: no static check can know it is geometric."""

    def transform(self, results):
        results['img'] = results['img'][:, ::-1].copy()
        return results


@TRANSFORMS.register_module(force=True)
class VisibleOnlyCrop(BaseTransform):

    def transform(self, results):
        results['img'] = results['img'][4:, 4:].copy()
        results['img_shape'] = results['img'].shape[:2]
        return results


@TRANSFORMS.register_module(force=True)
class BothFlip(BaseTransform):
    """A user's own paired transform: moves both images alike."""

    def transform(self, results):
        results['img'] = results['img'][:, ::-1].copy()
        results['ir_img'] = results['ir_img'][:, ::-1].copy()
        w = results['img'].shape[1]
        results['gt_bboxes'].flip_(results['img'].shape[:2])
        mat = np.array([[-1, 0, w], [0, 1, 0], [0, 0, 1]], np.float32)
        results['homography_matrix'] = mat @ results.get(
            'homography_matrix', np.eye(3, dtype=np.float32))
        return results


@pytest.mark.parametrize('step,what', [
    (dict(type='VisibleOnlyFlip'), 'flipped (horizontal)'),
    (dict(type='VisibleOnlyCrop'), 'size'),
    (dict(type='mmdet.RandomFlip', prob=1.0), 'homography_matrix'),
])
def test_unknown_one_modality_step_refused_at_run_time(demo_root, step,
                                                       what):
    """The static check cannot know a user's transform: the pipeline sees
    what the step did to each image and refuses it, naming the step."""
    cfg = demo_train_dataset_cfg(demo_root, step)
    if step['type'] == 'mmdet.RandomFlip':
        # reach the run-time check past the static one
        ds = DATASETS.build(demo_train_dataset_cfg(demo_root))
        ds.pipeline = PairedCompose(
            ds.pipeline.transforms[:3] +
            [TRANSFORMS.build(dict(type='RandomFlip', prob=1.0))] +
            ds.pipeline.transforms[4:], owner='test')
    else:
        ds = DATASETS.build(cfg)
    with pytest.raises(PairGeometryError) as info:
        ds.prepare_data(0)
    message = str(info.value)
    assert 'pipeline[3]' in message and what in message, message
    assert 'visible=' in message and 'infrared=' in message
    assert 'PairedGeometric' in message or 'PairedRandomFlip' in message


def test_users_paired_transform_passes_and_is_recorded(demo_root):
    ds = DATASETS.build(demo_train_dataset_cfg(demo_root,
                                               dict(type='BothFlip')))
    ds.pipeline.transforms[-1] = lambda r: r  # keep the results dict
    out = ds.prepare_data(1)
    assert ('BothFlip', 'both') in out['pair_geometry_log']
    np.testing.assert_allclose(out['homography_matrix'],
                               out['ir_homography_matrix'], atol=1e-5)


def test_pack_refuses_diverged_geometry_naming_the_step():
    """A pipeline not run by PairedCompose (plain mmcv Compose): the
    recorded geometries still differ and PackPairedDetInputs says where."""
    pipeline = Compose([TRANSFORMS.build(c) for c in [
        dict(type='PairedResize', scale=(80, 60), keep_ratio=True),
        dict(type='RandomFlip', prob=1.0),
        dict(type='PackPairedDetInputs')]])
    with pytest.raises(ValueError) as info:
        pipeline(paired_results())
    message = str(info.value)
    assert 'geometry' in message and 'after PairedResize' in message, message
    assert 'infrared=' in message or 'infrared/x.png' in message


# ----------------------------------------------------------- randomness
class TorchFlip:
    """A geometric transform whose draw comes from torch's RNG."""

    def __call__(self, results):
        if float(torch.rand(1)) < 0.5:
            results['img'] = results['img'][:, ::-1].copy()
            results['gt_bboxes'].flip_(results['img'].shape[:2])
        return results


class OwnGeneratorFlip(TorchFlip):

    def __init__(self):
        self.rng = np.random.default_rng(0)


def test_torch_randomness_is_paired():
    transform = TRANSFORMS.build(dict(type='PairedGeometric',
                                      transform=TorchFlip()))
    outcomes = set()
    for seed in range(10):
        torch.manual_seed(seed)
        res = paired_results(seed)
        before = res['img'].copy()
        out = transform(res)
        assert alignment_errors(out) == [], seed
        outcomes.add(np.array_equal(out['img'], before))
    assert outcomes == {True, False}


def test_own_generator_refused():
    with pytest.raises(ValueError, match=r"\['rng'\].*own random"):
        TRANSFORMS.build(dict(type='PairedGeometric',
                              transform=OwnGeneratorFlip()))


# --------------------------------------------------------------- healthy
def test_healthy_demo_pipeline_is_bit_identical_to_plain_compose(
        demo_root):
    """The bookkeeping changes no pixel, box or random draw: the paired
    dataset's pipeline and a plain MMEngine Compose of the same transforms
    give identical samples and leave the same random state."""
    ds = DATASETS.build(demo_train_dataset_cfg(demo_root))
    assert isinstance(ds.pipeline, PairedCompose)
    plain = Compose(ds.pipeline.transforms)
    for idx in range(len(ds)):
        outs, states = [], []
        for pipeline in (ds.pipeline, plain):
            random.seed(idx)
            np.random.seed(idx)
            torch.manual_seed(idx)
            outs.append(pipeline(ds.get_data_info(idx)))
            states.append((random.random(), np.random.rand(),
                           float(torch.rand(1))))
        a, b = outs
        for key in ('visible', 'infrared'):
            assert torch.equal(a['inputs'][key], b['inputs'][key])
        assert torch.equal(a['data_samples'].gt_instances.bboxes.tensor,
                           b['data_samples'].gt_instances.bboxes.tensor)
        assert a['data_samples'].metainfo.keys() == \
            b['data_samples'].metainfo.keys()
        assert states[0] == states[1]
    assert ds.pipeline.transforms[3].__class__.__name__ == 'PairedRandomFlip'


def test_flip_geometry_recorded_for_both_modalities():
    flip = TRANSFORMS.build(dict(type='PairedRandomFlip', prob=1.0))
    out = flip(paired_results())
    expected = np.array([[-1, 0, W], [0, 1, 0], [0, 0, 1]], np.float64)
    np.testing.assert_allclose(out['homography_matrix'], expected)
    np.testing.assert_allclose(out['ir_homography_matrix'], expected)
    assert out['pair_geometry_log'] == [('PairedRandomFlip', 'both')]
    assert H == out['img'].shape[0]


def test_albu_in_paired_geometric_is_refused_from_the_config():
    from mmsafe.datasets.pipeline_check import pipeline_problems
    problems = pipeline_problems([dict(
        type='PairedGeometric', transform=dict(type='Albu', transforms=[]))])
    assert len(problems) == 1 and "library's own random" in problems[0]


@pytest.mark.parametrize('mix', [
    dict(type='Mosaic', img_scale=(64, 48), prob=1.0),
    dict(type='MixUp', img_scale=(64, 48)),
], ids=['Mosaic', 'MixUp'])
def test_plain_mix_around_a_paired_dataset_is_refused_when_built(
        tmp_path, mix):
    """SafeRunner's build_dataloader refuses a plain Mosaic / MixUp in a
    MultiImageMixDataset over a paired dataset, naming PairedGeometric
    (without it: a size error at the first sample, or an unmixed infrared
    image); the paired version builds."""
    from mmengine.registry import DefaultScope

    from mmsafe.datasets.pipeline_check import UnpairedTransformError
    from mmsafe.engine.runner import SafeRunner
    root = mix_tree(str(tmp_path / 'llvip'))

    def loader(step):
        return dict(
            batch_size=2, num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=False),
            collate_fn=dict(type='pseudo_collate'),
            dataset=dict(
                type='MultiImageMixDataset',
                dataset=dict(
                    type='LLVIPDataset', data_root=root + '/',
                    data_prefix=dict(img='visible/train/',
                                     ann='Annotations/'),
                    img_suffixes=('.png', ), filter_cfg=None,
                    pipeline=[dict(type='LoadPairedImageFromFile'),
                              dict(type='LoadAnnotations', with_bbox=True)]),
                pipeline=[step]))

    with DefaultScope.overwrite_default_scope('mmsafe'):
        with pytest.raises(UnpairedTransformError) as info:
            SafeRunner.build_dataloader(loader(mix))
        message = str(info.value)
        assert 'MultiImageMixDataset, around a paired dataset' in message
        assert f"pipeline[0] {mix['type']}" in message
        assert "transform=dict(type='Mosaic'" in message
        built = SafeRunner.build_dataloader(
            loader(dict(type='PairedGeometric', transform=mix)))
        assert len(built.dataset) == 6

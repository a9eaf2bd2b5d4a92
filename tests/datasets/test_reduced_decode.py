"""Reduced JPEG decoding (``LoadPairedImageFromFile(reduced_decode=...)``):
the LLVIP recipe's pipelines give the same boxes, ``scale_factor``,
``ori_shape`` and metrics with and without it on 1280x1024 pairs; pairs
that decode to different sizes are refused; non-JPEG files fall back to a
full decode, said once."""
import copy
import os.path as osp

import numpy as np
import pytest
import torch

import mmsafe  # noqa: F401  (registers)
from mmdet.registry import DATASETS, METRICS, TRANSFORMS
from mmdet.structures.bbox import scale_boxes
from mmengine.config import Config
from mmsafe.datasets import ensure_synthetic_llvip
from mmsafe.datasets.transforms import reduced_jpeg_decode as rd
from tests.utils import logged_messages
from .tree import infrared_image, visible_image, write_img

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
BASE = osp.join(REPO, 'configs', '_base_', 'datasets', 'llvip.py')
SYNTH = dict(num_train=2, num_test=3, img_size=(1280, 1024), seed=0,
             max_people=4, empty_ratio=0.0, person_height=(60, 500))


@pytest.fixture(scope='module')
def llvip_1280(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('llvip1280') / 'llvip')
    return ensure_synthetic_llvip(root, **SYNTH)


def recipe_dataset(root: str, split: str, reduced: bool):
    """The LLVIP recipe's dataset (its pipeline from the config), reduced
    decode as in the recipe or off."""
    cfg = Config.fromfile(BASE)
    assert cfg.reduced_decode == dict(scale=(640, 512), keep_ratio=True)
    name = 'train_pipeline' if split == 'train' else 'test_pipeline'
    pipeline = copy.deepcopy(cfg[name])
    assert pipeline[0]['reduced_decode'] == cfg.reduced_decode
    if not reduced:
        pipeline[0]['reduced_decode'] = None
    for step in pipeline:
        if step['type'] == 'PairedRandomFlip':
            step['prob'] = 1.0  # the flip is exercised, the same both ways
    return DATASETS.build(dict(
        type='LLVIPDataset', data_root=root,
        data_prefix=dict(img=f'visible/{split}/', ir_img=f'infrared/{split}/',
                         ann='Annotations/'),
        test_mode=split == 'test', filter_cfg=None, pipeline=pipeline))


def boxes_of(sample) -> torch.Tensor:
    b = sample.gt_instances.bboxes
    return getattr(b, 'tensor', b).float()


def pairs(root: str, split: str):
    full = recipe_dataset(root, split, reduced=False)
    reduced = recipe_dataset(root, split, reduced=True)
    assert len(full) == len(reduced) > 0
    return [(full[i], reduced[i]) for i in range(len(full))]


@pytest.mark.parametrize('split', ['train', 'test'])
def test_same_bookkeeping_as_full_decode(llvip_1280, split):
    for full, reduced in pairs(llvip_1280, split):
        f, r = full['data_samples'], reduced['data_samples']
        assert f.ori_shape == r.ori_shape == (1024, 1280)
        assert f.img_shape == r.img_shape == (512, 640)
        assert np.allclose(f.scale_factor, (0.5, 0.5))
        assert np.allclose(r.scale_factor, f.scale_factor, atol=1e-9)
        fb, rb = boxes_of(f), boxes_of(r)
        assert len(fb) == len(rb) > 0
        # train: boxes of the 640x512 input; test: of the 1280x1024 file
        assert torch.allclose(fb, rb,
                              atol=1.0)
        if split == 'test':
            assert float(rb.max()) > 640  # original frame
        for mod in ('visible', 'infrared'):
            a = full['inputs'][mod].float()
            b = reduced['inputs'][mod].float()
            assert a.shape == b.shape
            assert float((a - b).abs().mean()) < 2.0  # grey levels


def test_decode_is_in_each_modality_geometry(llvip_1280):
    ds = recipe_dataset(llvip_1280, 'train', reduced=True)
    pipeline = ds.pipeline
    results = ds.get_data_info(0)
    names = [type(t).__name__ for t in pipeline.transforms]
    for t in pipeline.transforms[:names.index('PackPairedDetInputs')]:
        results = t(results)
        if type(t).__name__ == 'LoadPairedImageFromFile':
            assert results['img'].shape[:2] == (512, 640)
            assert np.allclose(results['homography_matrix'],
                               np.diag([0.5, 0.5, 1]))
            assert np.allclose(results['ir_homography_matrix'],
                               np.diag([0.5, 0.5, 1]))
            assert results['scale_factor'] == (0.5, 0.5)
            assert results['pair_geometry_log'] == [
                ('LoadPairedImageFromFile (decode visible 1/2, infrared 1/2)',
                 'both')]
    flip = np.array([[-0.5, 0, 640], [0, 0.5, 0], [0, 0, 1]])
    assert np.allclose(results['homography_matrix'], flip)
    assert np.allclose(results['ir_homography_matrix'], flip)
    assert rd.DECODE_KEY not in results  # folded into the resize
    assert [n for n, _ in results['pair_geometry_log']][1:] == [
        'PairedRandomFlip']  # the resize by 1.0 moved nothing


def fake_predictions(root: str):
    """Fixed predictions in the network's 640x512 frame (from the full
    decode's ground truth: shifted, one missed, one false positive), as the
    detector outputs them before rescaling."""
    preds = []
    for i, (full, _) in enumerate(pairs(root, 'test')):
        s = full['data_samples']
        gt = boxes_of(s) * 0.5
        shift = torch.tensor([3.0, -2.0, 5.0, 1.0]) * (i + 1)
        boxes = torch.cat([gt[1:] + shift, torch.tensor(
            [[10.0, 10.0, 60.0, 120.0]])])
        scores = torch.linspace(0.9, 0.3, len(boxes))
        preds.append((boxes, scores))
    return preds


def evaluate(root: str, reduced: bool, preds, metric_cfg) -> dict:
    metric = METRICS.build(metric_cfg)
    metric.dataset_meta = dict(classes=('person', ))
    ds = recipe_dataset(root, 'test', reduced=reduced)
    samples = []
    for i, (boxes, scores) in enumerate(preds):
        s = ds[i]['data_samples']
        # what the bbox head does with rescale=True
        rescaled = scale_boxes(boxes.clone(),
                               [1 / f for f in s.scale_factor])
        d = s.to_dict()
        d['pred_instances'] = dict(bboxes=rescaled, scores=scores,
                                   labels=torch.zeros(len(boxes),
                                                      dtype=torch.long))
        samples.append(d)
    metric.process({}, samples)
    return metric.evaluate(len(samples))


@pytest.mark.parametrize('metric_cfg', [
    dict(type='VOCMetric', metric='mAP', eval_mode='area', iou_thrs=0.5),
    dict(type='CocoStyleMetric'),
])
def test_same_metric_as_full_decode(llvip_1280, metric_cfg):
    preds = fake_predictions(llvip_1280)
    full = evaluate(llvip_1280, False, preds, metric_cfg)
    reduced = evaluate(llvip_1280, True, preds, metric_cfg)
    assert full.keys() == reduced.keys()
    key = [k for k in full if k.endswith('/mAP') or k.endswith('bbox_mAP')]
    assert len(key) == 1, full
    key = key[0]
    assert 0.05 < full[key] < 0.95  # neither trivial nor hopeless
    for k in full:
        assert round(full[k], 3) == round(reduced[k], 3), k


def load(results: dict, **kwargs):
    return TRANSFORMS.build(dict(type='LoadPairedImageFromFile',
                                 **kwargs))(dict(results))


REDUCED = dict(scale=(64, 48), keep_ratio=True)


def test_pair_decoding_to_different_sizes_is_refused(tmp_path):
    # visible JPEG reduced to 1/2, infrared PNG decoded in full
    vis = str(tmp_path / 'v.jpg')
    ir = str(tmp_path / 'i.png')
    write_img(vis, visible_image(128, 96))
    write_img(ir, infrared_image(128, 96))
    with pytest.raises(ValueError, match='sizes differ') as err:
        load(dict(img_path=vis, ir_img_path=ir), reduced_decode=REDUCED)
    msg = str(err.value)
    assert vis in msg and ir in msg and 'decoded at 1/2' in msg
    # without the reduced decode the same pair loads
    out = load(dict(img_path=vis, ir_img_path=ir))
    assert out['img_shape'] == (96, 128)


def test_non_jpeg_falls_back_to_full_decode_said_once(tmp_path):
    rd._fallback_logged.discard('PNG')
    vis = str(tmp_path / 'v.png')
    ir = str(tmp_path / 'i.png')
    write_img(vis, visible_image(128, 96))
    write_img(ir, infrared_image(128, 96))
    with logged_messages() as messages:
        for _ in range(3):
            out = load(dict(img_path=vis, ir_img_path=ir),
                       reduced_decode=REDUCED)
            assert out['img_shape'] == out['ori_shape'] == (96, 128)
            assert 'scale_factor' not in out and rd.DECODE_KEY not in out
            assert np.array_equal(out['img'], visible_image(128, 96))
    said = [m for m in messages
            if 'PNG images cannot be decoded reduced' in m]
    assert len(said) == 1, messages
    assert vis in said[0]


def test_reduction_never_below_the_target():
    cfg = dict(scale=(640, 512), keep_ratio=True, max_reduction=8)
    assert rd.choose_reduction((1280, 1024), cfg) == 2
    assert rd.choose_reduction((1279, 1023), cfg) == 2  # 640x512
    assert rd.choose_reduction((1270, 1016), cfg) == 1  # 635x508
    assert rd.choose_reduction((5120, 4096), cfg) == 8
    assert rd.choose_reduction((5120, 4096), dict(cfg, max_reduction=4)) \
        == 4
    assert rd.choose_reduction((1280, 1024), dict(
        cfg, scale=(320, 320), keep_ratio=False)) == 2
    assert rd.choose_reduction((1280, 1024), dict(
        cfg, scale=(100, 300), keep_ratio=False)) == 2


def test_reduced_decode_without_a_paired_resize_is_refused(llvip_1280):
    with pytest.raises(ValueError, match='no paired resize'):
        DATASETS.build(dict(
            type='LLVIPDataset', data_root=llvip_1280,
            pipeline=[dict(type='LoadPairedImageFromFile',
                           reduced_decode=REDUCED),
                      dict(type='LoadAnnotations', with_bbox=True),
                      dict(type='PackPairedDetInputs')]))


@pytest.mark.parametrize('annotations_first', [True, False])
def test_single_modality_loader_same_bookkeeping(llvip_1280,
                                                 annotations_first):
    """LoadImageFromFileReduced + DecodeAwareResize in a visible-only
    pipeline: as LoadImageFromFile + Resize (annotations loaded before the
    resize: boxes of the network input; after: of the file)."""
    def dataset(reduced: bool):
        load = dict(type='LoadImageFromFileReduced',
                    reduced_decode=dict(scale=(640, 512))) if reduced \
            else dict(type='LoadImageFromFile')
        resize = dict(type='DecodeAwareResize' if reduced else 'Resize',
                      scale=(640, 512), keep_ratio=True)
        ann = dict(type='LoadAnnotations', with_bbox=True)
        middle = [ann, resize] if annotations_first else [resize, ann]
        return DATASETS.build(dict(
            type='LLVIPDataset', data_root=llvip_1280,
            return_modality_pair=False, filter_cfg=None,
            data_prefix=dict(img='visible/test/', ann='Annotations/'),
            pipeline=[load, *middle, dict(
                type='PackDetInputs',
                meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                           'scale_factor'))]))

    full, reduced = dataset(False), dataset(True)
    for i in range(len(full)):
        f, r = full[i]['data_samples'], reduced[i]['data_samples']
        assert f.ori_shape == r.ori_shape == (1024, 1280)
        assert f.img_shape == r.img_shape == (512, 640)
        assert np.allclose(r.scale_factor, f.scale_factor, atol=1e-9)
        assert np.allclose(r.scale_factor, (0.5, 0.5))
        assert torch.allclose(boxes_of(f), boxes_of(r), atol=1.0)
        assert len(boxes_of(f)) > 0


def test_off_by_default_and_in_the_cpu_demo():
    assert TRANSFORMS.build(dict(
        type='LoadPairedImageFromFile')).reduced_decode is None
    demo = Config.fromfile(osp.join(REPO, 'configs', 'llvip', 'demo_cpu.py'))
    for loader in ('train_dataloader', 'val_dataloader'):
        step = demo[loader]['dataset']['pipeline'][0]
        assert step['type'] == 'LoadPairedImageFromFile'
        assert step.get('reduced_decode') is None


def test_masks_are_refused(tmp_path):
    vis, ir = str(tmp_path / 'v.jpg'), str(tmp_path / 'i.jpg')
    write_img(vis, visible_image(128, 96))
    write_img(ir, infrared_image(128, 96))
    instances = [dict(bbox=[0, 0, 10, 10], bbox_label=0,
                      mask=[[0, 0, 10, 0, 10, 10]])]
    with pytest.raises(ValueError, match='does not scale masks'):
        load(dict(img_path=vis, ir_img_path=ir, instances=instances),
             reduced_decode=REDUCED)
    # the boxes of a mask-free sample are scaled, the originals kept
    out = load(dict(img_path=vis, ir_img_path=ir,
                    instances=[dict(bbox=[8, 4, 40, 60], bbox_label=0)]),
               reduced_decode=REDUCED)
    assert out['instances'][0]['bbox'] == [4, 2, 20, 30]
    assert out[rd.ORI_INSTANCES_KEY][0]['bbox'] == [8, 4, 40, 60]


def test_jpeg_header_size_is_what_pil_reads(tmp_path):
    """The frame-header walk gives PIL's size for baseline, progressive,
    grey and restart-marker JPEGs and for APP segments (EXIF, ICC) before
    the frame header; other bytes go to PIL as before."""
    import io

    import cv2
    from PIL import Image
    img = visible_image(133, 71)
    encoded = [
        cv2.imencode('.jpg', img)[1].tobytes(),
        cv2.imencode('.jpg', img, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1]
        .tobytes(),
        cv2.imencode('.jpg', img[..., 0])[1].tobytes(),
        cv2.imencode('.jpg', img, [cv2.IMWRITE_JPEG_RST_INTERVAL, 2])[1]
        .tobytes(),
    ]
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: the size is still the frame's
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, 'JPEG', exif=exif.tobytes(),
                              icc_profile=b'\0' * 70000)
    encoded.append(buf.getvalue())
    for data in encoded:
        assert rd.jpeg_frame_size(data) == (133, 71)
        assert rd.image_size(data) == Image.open(io.BytesIO(data)).size
    png = cv2.imencode('.png', img)[1].tobytes()
    assert rd.jpeg_frame_size(png) is None
    assert rd.image_size(png) == (133, 71)
    # cut before the frame header: no size from the walk, PIL's error
    assert rd.jpeg_frame_size(encoded[-1][:2000]) is None
    with pytest.raises(Exception):
        rd.image_size(encoded[-1][:2000])


@pytest.mark.parametrize('reduced', [True, False])
def test_grey_infrared_decode_is_the_colour_decode_of_grey_jpegs(
        llvip_1280, reduced, tmp_path):
    """``ir_color_type='grayscale'`` on grey 3-channel JPEGs (LLVIP's
    infrared: R = G = B): the same ``ir_img`` as the colour decode, bit
    for bit, at full size and at 1/2. On a tinted file it is the luma
    (what the option documents), not the colour decode."""
    ds = recipe_dataset(llvip_1280, 'train', reduced=reduced)
    cfg = dict(reduced_decode=REDUCED if reduced else None)
    for i in range(len(ds)):
        info = ds.get_data_info(i)
        colour = load(info, **cfg)
        grey = load(info, ir_color_type='grayscale', **cfg)
        assert grey['ir_img'].shape == colour['ir_img'].shape
        assert grey['ir_img'].dtype == colour['ir_img'].dtype
        assert grey['ir_img'].flags.c_contiguous
        assert np.array_equal(grey['ir_img'], colour['ir_img'])
        assert np.array_equal(grey['img'], colour['img'])
    tinted = infrared_image(128, 96).copy()
    tinted[..., 2] = 200
    vis, ir = str(tmp_path / 'v.jpg'), str(tmp_path / 'i.jpg')
    write_img(vis, visible_image(128, 96))
    write_img(ir, tinted)
    colour = load(dict(img_path=vis, ir_img_path=ir), **cfg)
    grey = load(dict(img_path=vis, ir_img_path=ir),
                ir_color_type='grayscale', **cfg)
    assert not np.array_equal(grey['ir_img'], colour['ir_img'])

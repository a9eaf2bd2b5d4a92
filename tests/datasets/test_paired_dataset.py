"""PairedModalityDataset over MMDetection's own VOC and COCO datasets."""
import os
import os.path as osp
import pickle

import numpy as np
import pytest

import mmsafe  # noqa: F401  (registers)
import mmsafe.datasets.pairing as pairing_mod
from mmdet.registry import DATASETS
from .tree import (infrared_image, make_coco_tree, make_voc_tree,
                   visible_image)

PIPELINE = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedRandomFlip', prob=0.5),
    dict(type='PackPairedDetInputs'),
]
STEMS = ['000001', '000002', '000003']


def voc_cfg(root, **kwargs):
    return dict(type='VOCDataset', data_root=root,
                ann_file='VOC2007/ImageSets/Main/train.txt',
                data_prefix=dict(sub_data_root='VOC2007/'), **kwargs)


def coco_cfg(root, **kwargs):
    return dict(type='CocoDataset', data_root=root,
                ann_file='annotations/train.json',
                data_prefix=dict(img='images/visible/'),
                metainfo=dict(classes=('person', )), **kwargs)


def check_sample(ds, idx, w=64, h=48):
    info = ds.get_data_info(idx)
    out = ds[idx]
    vis = out['inputs']['visible'].permute(1, 2, 0).numpy()
    ir = out['inputs']['infrared'].permute(1, 2, 0).numpy()
    flipped = out['data_samples'].flip
    want_vis = visible_image(w, h, idx)
    want_ir = infrared_image(w, h)
    if flipped:
        want_vis, want_ir = want_vis[:, ::-1], want_ir[:, ::-1]
    # jpg: compare loosely, but the two gradients are orthogonal, so a swap
    # or a one-sided flip would be far off
    assert np.abs(vis[..., 0].astype(int) - want_vis[..., 0]).mean() < 4
    assert np.abs(ir[..., 0].astype(int) - want_ir[..., 0]).mean() < 4
    assert out['data_samples'].ir_img_path == info['ir_img_path']
    return info


@pytest.mark.parametrize('partner', [
    dict(find='/JPEGImages/', replace='/InfraredImages/'),
    dict(pattern=r'JPEGImages/(\d+)\.jpg$', repl=r'InfraredImages/\1.jpg'),
    dict(field='ir_filename', prefix=None),
])
def test_voc_style(tmp_path, partner):
    root = str(tmp_path / 'voc')
    make_voc_tree(root, STEMS)
    # field: the xml holds '../InfraredImages/x.jpg', relative to the
    # visible image's folder (the default prefix for VOC)
    ds = DATASETS.build(dict(type='PairedModalityDataset',
                             dataset=voc_cfg(root), partner=partner,
                             pipeline=PIPELINE))
    assert len(ds) == 3
    assert ds.metainfo['classes'][14] == 'person'
    for i in range(3):
        info = check_sample(ds, i)
        assert osp.normpath(info['ir_img_path']) == osp.join(
            root, 'VOC2007', 'InfraredImages', f'{STEMS[i]}.jpg')


@pytest.mark.parametrize('partner', [
    dict(field='ir_file_name'),
    dict(find='/visible/', replace='/lwir/'),
])
def test_coco_style(tmp_path, partner):
    root = str(tmp_path / 'coco')
    make_coco_tree(root, [f'{s}.jpg' for s in STEMS])
    ds = DATASETS.build(dict(type='PairedModalityDataset',
                             dataset=coco_cfg(root, pipeline=PIPELINE),
                             partner=partner))
    assert len(ds) == 3 and ds.metainfo['classes'] == ('person', )
    for i in range(3):
        info = check_sample(ds, i)
        assert osp.normpath(info['ir_img_path']) == osp.join(
            root, 'images', 'lwir', f'{STEMS[i]}.jpg')
        assert len(ds[i]['data_samples'].gt_instances) == 1


def test_missing_partner_error_and_skip(tmp_path, monkeypatch):
    root = str(tmp_path / 'coco')
    make_coco_tree(root, [f'{s}.jpg' for s in STEMS])
    os.remove(osp.join(root, 'images', 'lwir', '000002.jpg'))
    cfg = dict(type='PairedModalityDataset', dataset=coco_cfg(root),
               partner=dict(field='ir_file_name'), pipeline=PIPELINE)
    with pytest.raises(FileNotFoundError) as err:
        DATASETS.build(cfg)
    assert '1 of 3' in str(err.value) and '000002.jpg' in str(err.value)
    lines = []
    monkeypatch.setattr(pairing_mod, 'log',
                        lambda m, level=None: lines.append(m))
    ds = DATASETS.build(dict(cfg, on_missing_pair='skip'))
    assert len(ds) == 2
    assert [osp.basename(ds.get_data_info(i)['img_path'])
            for i in range(2)] == ['000001.jpg', '000003.jpg']
    assert any('dropped 1 of 3' in m for m in lines)


def test_rule_that_does_not_apply_is_a_missing_partner(tmp_path):
    root = str(tmp_path / 'voc')
    make_voc_tree(root, STEMS)
    with pytest.raises(FileNotFoundError, match='does not apply'):
        DATASETS.build(dict(type='PairedModalityDataset',
                            dataset=voc_cfg(root),
                            partner=dict(find='/RGB/', replace='/IR/')))


def test_pipeline_in_one_place_only(tmp_path):
    root = str(tmp_path / 'voc')
    make_voc_tree(root, STEMS)
    with pytest.raises(ValueError, match='not both'):
        DATASETS.build(dict(type='PairedModalityDataset',
                            dataset=voc_cfg(root, pipeline=PIPELINE),
                            partner=dict(find='/JPEGImages/',
                                         replace='/InfraredImages/'),
                            pipeline=PIPELINE))


@pytest.mark.parametrize('serialize_data', [True, False])
def test_wrapper_pickles(tmp_path, serialize_data):
    root = str(tmp_path / 'coco')
    make_coco_tree(root, [f'{s}.jpg' for s in STEMS])
    ds = DATASETS.build(dict(
        type='PairedModalityDataset',
        dataset=coco_cfg(root, serialize_data=serialize_data),
        partner=dict(field='ir_file_name'), pipeline=PIPELINE))
    ds.get_data_info(0)
    clone = pickle.loads(pickle.dumps(ds))
    for i in range(3):
        assert clone.get_data_info(i) == ds.get_data_info(i)
    assert set(clone[1]['inputs']) == {'visible', 'infrared'}

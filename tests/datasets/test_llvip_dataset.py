"""LLVIPDataset on tiny trees in the real LLVIP layout."""
import os
import os.path as osp
import pickle

import numpy as np
import pytest
from mmengine.logging import MessageHub

import mmsafe  # noqa: F401  (registers)
import mmsafe.datasets.llvip as llvip_mod
import mmsafe.datasets.pairing as pairing_mod
from mmdet.registry import DATASETS
from mmsafe.datasets import LLVIPDataset
from .tree import infrared_image, make_llvip_tree, visible_image

PIPELINE = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackPairedDetInputs'),
]


@pytest.fixture
def llvip(tmp_path):
    root = str(tmp_path / 'LLVIP')
    specs = make_llvip_tree(root)
    return root, specs


@pytest.fixture
def logs(monkeypatch):
    lines = []
    for mod in (llvip_mod, pairing_mod):
        monkeypatch.setattr(mod, 'log',
                            lambda msg, level=None: lines.append(msg))
    return lines


def build(root, **kwargs):
    cfg = dict(type='LLVIPDataset', data_root=root, pipeline=PIPELINE)
    cfg.update(kwargs)
    return DATASETS.build(cfg)


def test_folder_mode_reads_pairs_and_voc_boxes(llvip):
    root, specs = llvip
    ds = build(root)
    assert len(ds) == 5
    assert ds.metainfo['classes'] == ('person', )
    infos = [ds.get_data_info(i) for i in range(len(ds))]
    assert [i['img_id'] for i in infos] == sorted(specs)
    for info in infos:
        stem = info['img_id']
        assert info['img_path'] == osp.join(root, 'visible', 'train',
                                            stem + '.png')
        assert info['ir_img_path'] == osp.join(root, 'infrared', 'train',
                                               stem + '.png')
        assert (info['width'], info['height']) == specs[stem]['size']
    # 010003: person, difficult person (ignored), car (not a class: dropped)
    inst = infos[2]['instances']
    assert [i['ignore_flag'] for i in inst] == [0, 1]
    assert inst[0]['bbox'] == [9, 4, 29, 34]  # VOC 1-based -> 0-based
    assert all(i['bbox_label'] == 0 for i in inst)
    assert infos[1]['instances'] == []

    data = ds[2]
    vis, ir = data['inputs']['visible'], data['inputs']['infrared']
    assert vis.dtype == ir.dtype == np.uint8 or str(vis.dtype) == 'torch.uint8'
    # the right file went into each key (different synthetic content)
    assert np.array_equal(vis.permute(1, 2, 0).numpy(), visible_image(80, 40,
                                                                      2))
    assert np.array_equal(ir.permute(1, 2, 0).numpy(), infrared_image(80, 40))
    sample = data['data_samples']
    assert sample.ir_img_path == infos[2]['ir_img_path']
    assert len(sample.gt_instances) == 1
    assert len(sample.ignored_instances) == 1


def test_imagesets_mode_keeps_file_order(llvip, tmp_path):
    root, _ = llvip
    sets = osp.join(root, 'ImageSets')
    os.makedirs(sets)
    with open(osp.join(sets, 'sub.txt'), 'w') as f:
        f.write('010004\n010001.png\n\n')
    ds = build(root, ann_file='ImageSets/sub.txt', img_suffix='.png')
    assert [ds.get_data_info(i)['img_id'] for i in range(len(ds))] == [
        '010004', '010001'
    ]


def test_missing_partner_is_an_error_naming_count_and_files(llvip):
    root, _ = llvip
    os.remove(osp.join(root, 'infrared', 'train', '010002.png'))
    os.remove(osp.join(root, 'infrared', 'train', '010005.png'))
    with pytest.raises(FileNotFoundError) as err:
        build(root)
    msg = str(err.value)
    assert '2 of 5' in msg
    assert osp.join('infrared', 'train', '010002.png') in msg
    assert osp.join('infrared', 'train', '010005.png') in msg
    assert "on_missing_pair='skip'" in msg


def test_missing_annotation_is_an_error_naming_the_file(llvip):
    root, _ = llvip
    os.remove(osp.join(root, 'Annotations', '010003.xml'))
    with pytest.raises(FileNotFoundError) as err:
        build(root)
    msg = str(err.value)
    assert '1 of 5 images have no annotation xml in' in msg
    assert osp.join('Annotations', '010003.xml') in msg


def test_missing_visible_listed_in_imagesets_is_a_missing_pair(llvip):
    root, _ = llvip
    os.makedirs(osp.join(root, 'ImageSets'))
    with open(osp.join(root, 'ImageSets', 'all.txt'), 'w') as f:
        f.write('010001\n019999\n')
    with pytest.raises(FileNotFoundError, match='1 of 2') as err:
        build(root, ann_file='ImageSets/all.txt', img_suffix='.png')
    assert 'both images missing' in str(err.value)


def test_skip_drops_and_logs_missing_pairs(llvip, logs):
    root, _ = llvip
    os.remove(osp.join(root, 'infrared', 'train', '010002.png'))
    MessageHub.get_current_instance().update_info('mmsafe/pairing', {})
    ds = build(root, on_missing_pair='skip')
    assert len(ds) == 4
    assert '010002' not in [ds.get_data_info(i)['img_id'] for i in range(4)]
    assert any('dropped 1 of 5' in line and '010002.png' in line
               for line in logs), logs
    hub = MessageHub.get_current_instance()
    assert hub.get_info('mmsafe/pairing')['missing_pairs_skipped'] == 1


def test_skip_with_no_pair_left_is_still_an_error(llvip):
    root, _ = llvip
    for name in os.listdir(osp.join(root, 'infrared', 'train')):
        os.remove(osp.join(root, 'infrared', 'train', name))
    with pytest.raises(FileNotFoundError, match='No sample has a partner'):
        build(root, on_missing_pair='skip')


def test_missing_annotation_is_an_error(llvip):
    root, _ = llvip
    os.remove(osp.join(root, 'Annotations', '010003.xml'))
    with pytest.raises(FileNotFoundError, match='annotation xml'):
        build(root)


def test_visible_only_is_explicit_and_logged(llvip, logs):
    root, _ = llvip
    os.remove(osp.join(root, 'infrared', 'train', '010002.png'))
    ds = build(root, return_modality_pair=False)
    assert len(ds) == 5
    assert all('ir_img_path' not in ds.get_data_info(i) for i in range(5))
    assert any('VISIBLE images only' in line for line in logs), logs
    # a paired pipeline refuses visible-only samples instead of guessing
    with pytest.raises(KeyError, match='not paired'):
        ds[0]


def test_test_split_prefix_derives_infrared_folder(llvip):
    root, _ = llvip
    make_llvip_tree(root, split='test', specs={
        '190001': dict(size=(32, 32), objects=[])})
    ds = build(root, data_prefix=dict(img='visible/test/'), test_mode=True)
    assert len(ds) == 1
    assert ds.get_data_info(0)['ir_img_path'] == osp.join(
        root, 'infrared', 'test', '190001.png')


def test_filter_empty_gt(llvip, logs):
    root, _ = llvip
    ds = build(root, filter_cfg=dict(filter_empty_gt=True))
    assert len(ds) == 4
    assert any('removed 1 of 5' in line for line in logs)


@pytest.mark.parametrize('serialize_data', [True, False])
def test_dataset_pickles(llvip, serialize_data):
    root, _ = llvip
    ds = build(root, serialize_data=serialize_data)
    if serialize_data:
        assert ds.data_bytes.nbytes > 0 and ds.data_list == []
    clone = pickle.loads(pickle.dumps(ds))
    assert isinstance(clone, LLVIPDataset)
    for i in range(len(ds)):
        assert clone.get_data_info(i) == ds.get_data_info(i)
    out = clone[2]
    assert set(out['inputs']) == {'visible', 'infrared'}

"""Paired datasets through a real DataLoader with spawn-started workers
(as on Windows): the dataset (serialize_data=True) and the pipeline are
pickled into each worker."""
import os.path as osp
import pickle

import pytest
from mmengine.dataset import pseudo_collate
from torch.utils.data import DataLoader

import mmsafe  # noqa: F401  (registers)
from mmdet.registry import DATASETS
from .tree import make_coco_tree

TRAIN_PIPELINE = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedRandomResize', scale=(96, 80), ratio_range=(0.8, 1.2),
         keep_ratio=True),
    dict(type='PairedRandomFlip', prob=0.5),
    dict(type='ModalityTransform', modality='infrared',
         transform=dict(type='PhotoMetricDistortion')),
    dict(type='PairedPad', size_divisor=32),
    dict(type='PackPairedDetInputs'),
]


def check_loader(dataset, expected):
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, shuffle=False,
        multiprocessing_context='spawn', collate_fn=pseudo_collate,
        persistent_workers=False, timeout=180)
    seen = []
    for batch in loader:
        assert set(batch['inputs']) == {'visible', 'infrared'}
        for vis, ir, sample in zip(batch['inputs']['visible'],
                                   batch['inputs']['infrared'],
                                   batch['data_samples']):
            assert vis.shape == ir.shape and vis.shape[1] % 32 == 0
            assert osp.basename(sample.img_path) == osp.basename(
                sample.ir_img_path)
            assert sample.img_path != sample.ir_img_path
            seen.append(sample.img_path)
    assert sorted(seen) == sorted(expected)


@pytest.mark.timeout(600)
def test_llvip_with_spawn_workers(tmp_path):
    ds = DATASETS.build(dict(
        type='LLVIPDataset', data_root=str(tmp_path / 'llvip'),
        synthetic=dict(num_train=8, num_test=2, img_size=(96, 80)),
        serialize_data=True, pipeline=TRAIN_PIPELINE))
    assert ds.serialize_data and len(ds.data_bytes) > 0
    pickle.loads(pickle.dumps(ds.pipeline))
    check_loader(ds, [ds.get_data_info(i)['img_path'] for i in range(8)])


@pytest.mark.timeout(600)
def test_paired_wrapper_with_spawn_workers(tmp_path):
    root = str(tmp_path / 'coco')
    make_coco_tree(root, [f'{i:06d}.jpg' for i in range(5)])
    ds = DATASETS.build(dict(
        type='PairedModalityDataset',
        dataset=dict(type='CocoDataset', data_root=root,
                     ann_file='annotations/train.json',
                     data_prefix=dict(img='images/visible/'),
                     metainfo=dict(classes=('person', )),
                     serialize_data=True),
        partner=dict(field='ir_file_name'), pipeline=TRAIN_PIPELINE))
    check_loader(ds, [ds.get_data_info(i)['img_path'] for i in range(5)])

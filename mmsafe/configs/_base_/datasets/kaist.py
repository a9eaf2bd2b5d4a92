# KAIST multispectral pedestrians (visible + LWIR, 640x512) in its released
# layout, with any of its annotation releases found by itself, pure-Python
# style. Text twin (the layouts, the settings, the metrics):
# configs/_base_/datasets/kaist.py.
from mmdet.datasets import AspectRatioBatchSampler
from mmdet.datasets.transforms import LoadAnnotations
from mmengine.dataset import DefaultSampler

from mmsafe.datasets import KAISTDataset
from mmsafe.datasets.transforms import (LoadPairedImageFromFile,
                                        PackPairedDetInputs, PairedRandomFlip,
                                        PairedResize)
from mmsafe.evaluation import CocoStyleMetric, KAISTMissRate

dataset_type = KAISTDataset
data_root = 'data/kaist/'
backend_args = None
img_scale = (640, 512)

train_pipeline = [
    dict(type=LoadPairedImageFromFile, backend_args=backend_args),
    dict(type=LoadAnnotations, with_bbox=True),
    dict(type=PairedResize, scale=img_scale, keep_ratio=True),
    dict(type=PairedRandomFlip, prob=0.5),
    dict(type=PackPairedDetInputs)
]
test_pipeline = [
    dict(type=LoadPairedImageFromFile, backend_args=backend_args),
    dict(type=PairedResize, scale=img_scale, keep_ratio=True),
    dict(type=LoadAnnotations, with_bbox=True),
    dict(
        type=PackPairedDetInputs,
        meta_keys=('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                   'img_shape', 'scale_factor', 'instances'))
]

train_dataloader = dict(
    batch_size=4,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type=DefaultSampler, shuffle=True),
    batch_sampler=dict(type=AspectRatioBatchSampler),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='imageSets/train-all-02.txt',
        data_prefix=dict(img='images/'),
        min_height=0,
        max_occlusion=2,
        filter_cfg=dict(filter_empty_gt=True),
        pipeline=train_pipeline,
        backend_args=backend_args))
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type=DefaultSampler, shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='imageSets/test-all-20.txt',
        data_prefix=dict(img='images/'),
        min_height=55,
        max_occlusion=1,
        test_mode=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader

val_evaluator = [
    dict(type=KAISTMissRate, settings=('reasonable', 'all'), prefix='kaist'),
    dict(type=CocoStyleMetric, prefix='coco'),
]
test_evaluator = val_evaluator

# M3FD (4,200 visible/infrared pairs, 6 classes), pure-Python style.
# Text twin (the layout, the classes, the split):
# configs/_base_/datasets/m3fd.py.
from mmdet.datasets import AspectRatioBatchSampler
from mmdet.datasets.transforms import LoadAnnotations
from mmdet.evaluation import VOCMetric
from mmengine.dataset import DefaultSampler

from mmsafe.datasets import M3FDDataset
from mmsafe.datasets.transforms import (LoadPairedImageFromFile,
                                        PackPairedDetInputs, PairedRandomFlip,
                                        PairedResize)
from mmsafe.evaluation import CocoStyleMetric

dataset_type = M3FDDataset
data_root = 'data/M3FD_Detection/'
backend_args = None
img_scale = (1024, 768)

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
                   'img_shape', 'scale_factor'))
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
        ann_file='ImageSets/train.txt',
        filter_cfg=dict(filter_empty_gt=True, min_size=16),
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
        ann_file='ImageSets/val.txt',
        test_mode=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader

val_evaluator = [
    dict(type=VOCMetric, metric='mAP', eval_mode='area', iou_thrs=0.5,
         prefix='pascal_voc'),
    dict(type=CocoStyleMetric, prefix='coco'),
]
test_evaluator = val_evaluator

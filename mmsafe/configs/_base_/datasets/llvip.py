# LLVIP in its released layout, pure-Python style. Text twin (with the
# comments on each choice): configs/_base_/datasets/llvip.py.
from mmdet.datasets import AspectRatioBatchSampler
from mmdet.datasets.transforms import LoadAnnotations
from mmdet.evaluation import VOCMetric
from mmengine.dataset import DefaultSampler

from mmsafe.datasets import LLVIPDataset
from mmsafe.datasets.transforms import (KeepFreedMemory,
                                        LoadPairedImageFromFile,
                                        PackPairedDetInputs, PairedRandomFlip,
                                        PairedResize)
from mmsafe.evaluation import CocoStyleMetric

dataset_type = LLVIPDataset
data_root = 'data/LLVIP/'
backend_args = None
img_scale = (640, 512)
reduced_decode = dict(scale=img_scale, keep_ratio=True)

train_pipeline = [
    dict(type=LoadPairedImageFromFile, backend_args=backend_args,
         reduced_decode=reduced_decode),
    dict(type=LoadAnnotations, with_bbox=True),
    dict(type=PairedResize, scale=img_scale, keep_ratio=True),
    dict(type=PairedRandomFlip, prob=0.5),
    dict(type=PackPairedDetInputs),
    dict(type=KeepFreedMemory)
]
test_pipeline = [
    dict(type=LoadPairedImageFromFile, backend_args=backend_args,
         reduced_decode=reduced_decode),
    dict(type=PairedResize, scale=img_scale, keep_ratio=True),
    dict(type=LoadAnnotations, with_bbox=True),
    dict(
        type=PackPairedDetInputs,
        meta_keys=('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                   'img_shape', 'scale_factor')),
    dict(type=KeepFreedMemory)
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
        data_prefix=dict(
            img='visible/train/', ir_img='infrared/train/',
            ann='Annotations/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=16),
        return_modality_pair=True,
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
        data_prefix=dict(
            img='visible/test/', ir_img='infrared/test/',
            ann='Annotations/'),
        test_mode=True,
        return_modality_pair=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader

val_evaluator = [
    dict(type=VOCMetric, metric='mAP', eval_mode='area', iou_thrs=0.5,
         prefix='pascal_voc'),
    dict(type=CocoStyleMetric, prefix='coco'),
]
test_evaluator = val_evaluator

# The CPU demo, pure-Python style: the dual-stream Faster R-CNN with MACL on
# the synthetic LLVIP-like dataset, every mmsafe guard on. Text twin (with
# the comments on each choice): configs/llvip/demo_cpu.py. Train it with
#   python tools/train.py mmsafe/configs/llvip/demo_cpu.py
from mmengine.config import read_base
from mmengine.optim import CosineAnnealingLR, LinearLR
from mmengine.runner import EpochBasedTrainLoop, TestLoop, ValLoop
from torch.optim import AdamW

from mmdet.datasets.transforms import LoadAnnotations
from mmsafe.datasets.transforms import (LoadPairedImageFromFile,
                                        PackPairedDetInputs, PairedRandomFlip,
                                        PairedResize)
from mmsafe.engine.hooks import MACLCheckHook
from mmsafe.engine.optimizers import NaNSkipOptimWrapper

with read_base():
    from .._base_.models.dual_faster_rcnn_r18w16_fpn_tiny import *  # noqa
    from .._base_.datasets.llvip import *  # noqa
    from ._base_.runtime_tensorboard import *  # noqa
    from .._base_.safety_runtime import *  # noqa

data_root = 'data/llvip_synthetic_demo/'
synthetic = dict(
    num_train=300, num_test=100, img_size=(160, 128), seed=0,
    max_people=5, empty_ratio=0.25, person_height=(30, 110))
img_scale = (160, 128)

train_pipeline = [
    dict(type=LoadPairedImageFromFile),
    dict(type=LoadAnnotations, with_bbox=True),
    dict(type=PairedResize, scale=img_scale, keep_ratio=True),
    dict(type=PairedRandomFlip, prob=0.5),
    dict(type=PackPairedDetInputs)
]
test_pipeline = [
    dict(type=LoadPairedImageFromFile),
    dict(type=PairedResize, scale=img_scale, keep_ratio=True),
    dict(type=LoadAnnotations, with_bbox=True),
    dict(
        type=PackPairedDetInputs,
        meta_keys=('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                   'img_shape', 'scale_factor'))
]

train_dataloader.update(
    batch_size=4, num_workers=0, persistent_workers=False,
    batch_sampler=None)
train_dataloader.dataset.update(
    data_root=data_root, synthetic=synthetic, pipeline=train_pipeline,
    filter_cfg=None)
val_dataloader.update(batch_size=4, num_workers=0, persistent_workers=False)
val_dataloader.dataset.update(
    data_root=data_root, synthetic=synthetic, pipeline=test_pipeline)
test_dataloader = val_dataloader

model.macl_head.update(pooling='max', loss_weight=0.5)

train_cfg = dict(type=EpochBasedTrainLoop, max_epochs=8, val_interval=2)
val_cfg = dict(type=ValLoop)
test_cfg = dict(type=TestLoop)

param_scheduler = [
    dict(type=LinearLR, start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type=CosineAnnealingLR, begin=0, end=8, by_epoch=True,
         eta_min_ratio=0.05, convert_to_iter_based=True)
]
optim_wrapper = dict(
    type=NaNSkipOptimWrapper,
    optimizer=dict(type=AdamW, lr=0.002, weight_decay=0.0001),
    clip_grad=dict(max_norm=10, norm_type=2))

default_hooks.logger.update(interval=10)
default_hooks.checkpoint.update(interval=2, max_keep_ckpts=1)
randomness = dict(seed=0)

# the safety fragment's MACLCheckHook (the sixth), demanding MACL
custom_hooks[5] = dict(
    type=MACLCheckHook, required=True, policy='raise', chance_warmup=250,
    control_interval=50, control_warmup=250)

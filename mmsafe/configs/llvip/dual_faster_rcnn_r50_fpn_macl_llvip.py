# Dual-stream Faster R-CNN (ResNet-50 FPN per modality, ImageNet init) with
# MACL on real LLVIP, pure-Python style. Text twin (normalisation with
# LLVIP's own statistics, the learning rate, the bands):
# configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py. Train it with
#   python tools/train.py \
#       mmsafe/configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py
from mmengine.config import read_base
from mmengine.optim import LinearLR, MultiStepLR
from mmengine.runner import EpochBasedTrainLoop, TestLoop, ValLoop
from torch.optim import SGD

from mmsafe.engine.hooks import MACLCheckHook, ScalarBandsHook
from mmsafe.engine.optimizers import NaNSkipOptimWrapper

with read_base():
    from .._base_.models.dual_faster_rcnn_r50_fpn import *  # noqa
    from .._base_.datasets.llvip import *  # noqa
    from ._base_.runtime_tensorboard import *  # noqa
    from .._base_.safety_runtime import *  # noqa

train_cfg = dict(type=EpochBasedTrainLoop, max_epochs=12, val_interval=1)
val_cfg = dict(type=ValLoop)
test_cfg = dict(type=TestLoop)

param_scheduler = [
    dict(type=LinearLR, start_factor=0.001, by_epoch=False, begin=0,
         end=500),
    dict(type=MultiStepLR, begin=0, end=12, by_epoch=True,
         milestones=[8, 11], gamma=0.1)
]
optim_wrapper = dict(
    type=NaNSkipOptimWrapper,
    optimizer=dict(type=SGD, lr=0.005, momentum=0.9, weight_decay=0.0001),
    clip_grad=dict(max_norm=35, norm_type=2))
auto_scale_lr = dict(enable=False, base_batch_size=4)

# the safety fragment's MACLCheckHook (the sixth), demanding MACL, and the
# expected bands of a healthy LLVIP run
custom_hooks[5] = dict(
    type=MACLCheckHook, required=True, policy='raise', chance_warmup=500,
    control_interval=50, control_warmup=500)
custom_hooks = custom_hooks + [
    dict(type=ScalarBandsHook, bands=[
        dict(key='grad_norm', max=20, action='warn', patience=20),
        dict(key='pascal_voc/mAP', min=0.52, after_epoch=1, action='warn'),
        dict(key='loss*', finite=True, action='stop', patience=3)]),
]

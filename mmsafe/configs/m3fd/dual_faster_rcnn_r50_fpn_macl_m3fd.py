# Dual-stream Faster R-CNN (ResNet-50 FPN per modality) with MACL on M3FD
# (6 classes), pure-Python style. Text twin:
# configs/m3fd/dual_faster_rcnn_r50_fpn_macl_m3fd.py. Train it with
#   python tools/make_m3fd_split.py data/M3FD_Detection   # once
#   python tools/train.py \
#       mmsafe/configs/m3fd/dual_faster_rcnn_r50_fpn_macl_m3fd.py
from mmengine.config import read_base
from mmengine.optim import LinearLR, MultiStepLR
from mmengine.runner import EpochBasedTrainLoop, TestLoop, ValLoop
from torch.optim import SGD

from mmsafe.engine.optimizers import NaNSkipOptimWrapper

with read_base():
    from .._base_.models.dual_faster_rcnn_r50_fpn import *  # noqa
    from .._base_.datasets.m3fd import *  # noqa
    from ..llvip._base_.runtime_tensorboard import *  # noqa
    from .._base_.safety_runtime import *  # noqa

model.roi_head.bbox_head.update(num_classes=6)  # M3FD_CLASSES

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

# Dual-stream Faster R-CNN (ResNet-50 FPN per modality, ImageNet init,
# ConcatConv fusion per FPN level) with the MACL cross-modal contrastive
# loss, on real LLVIP (data/LLVIP, see configs/_base_/datasets/llvip.py).
#   python tools/train.py configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py
#   torchrun --nproc_per_node=4 tools/train.py \
#       configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py --launcher pytorch
_base_ = [
    '../_base_/models/dual_faster_rcnn_r50_fpn.py',
    '../_base_/datasets/llvip.py',
    './_base_/runtime_tensorboard.py',
    # Safety runtime (guards and hooks), added here when available:
    # '../_base_/safety_runtime.py',
    # (then also optim_wrapper type='NaNSkipOptimWrapper' below)
]
custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)

# 12 epochs, VOC mAP50 on the test split after every epoch.
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
         end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True,
         milestones=[8, 11], gamma=0.1)
]

# lr 0.02 for a total batch of 16 (MMDetection's Faster R-CNN 1x), scaled
# linearly: 0.005 for one process with batch 4. clip_grad also makes
# train/grad_norm appear in the logs.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=0.005, momentum=0.9, weight_decay=0.0001),
    clip_grad=dict(max_norm=35, norm_type=2))

# python tools/train.py ... --auto-scale-lr rescales lr to the real total
# batch size.
auto_scale_lr = dict(enable=False, base_batch_size=4)

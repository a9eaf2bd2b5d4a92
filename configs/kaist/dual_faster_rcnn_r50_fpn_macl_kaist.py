# Dual-stream Faster R-CNN (ResNet-50 FPN per modality, ImageNet init) with
# MACL on KAIST multispectral pedestrians (data/kaist, see
# configs/_base_/datasets/kaist.py), evaluated by log-average miss rate
# (kaist/MR-2, reasonable setting) and COCO-style mAP:
#   python tools/train.py configs/kaist/dual_faster_rcnn_r50_fpn_macl_kaist.py
_base_ = [
    '../_base_/models/dual_faster_rcnn_r50_fpn.py',
    '../_base_/datasets/kaist.py',
    '../llvip/_base_/runtime_tensorboard.py',
    '../_base_/safety_runtime.py',
]
custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)

# Normalisation: ImageNet statistics (those of the backbones' init). For
# KAIST's own, run
#   python tools/check_dataset.py \
#       configs/kaist/dual_faster_rcnn_r50_fpn_macl_kaist.py --stats
# and paste the printed data_preprocessor lines here.

train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
         end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True,
         milestones=[8, 11], gamma=0.1)
]
optim_wrapper = dict(
    type='NaNSkipOptimWrapper',
    optimizer=dict(type='SGD', lr=0.005, momentum=0.9, weight_decay=0.0001),
    clip_grad=dict(max_norm=35, norm_type=2))
auto_scale_lr = dict(enable=False, base_batch_size=4)
# the best checkpoint has the lowest miss rate
default_hooks = dict(
    checkpoint=dict(save_best='kaist/MR-2', rule='less'))

# Dual-stream Faster R-CNN (ResNet-50 FPN per modality, ImageNet init) with
# MACL on M3FD (data/M3FD_Detection, see configs/_base_/datasets/m3fd.py):
# the 6 classes of mmsafe.datasets.m3fd.M3FD_CLASSES (TarDAL's order:
# People, Car, Bus, Lamp, Motorcycle, Truck).
#   python tools/make_m3fd_split.py data/M3FD_Detection   # once
#   python tools/train.py configs/m3fd/dual_faster_rcnn_r50_fpn_macl_m3fd.py
_base_ = [
    '../_base_/models/dual_faster_rcnn_r50_fpn.py',
    '../_base_/datasets/m3fd.py',
    '../llvip/_base_/runtime_tensorboard.py',
    '../_base_/safety_runtime.py',
]
custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)
model = dict(roi_head=dict(bbox_head=dict(num_classes=6)))  # M3FD_CLASSES

# Normalisation: ImageNet statistics. For M3FD's own, run
#   python tools/check_dataset.py \
#       configs/m3fd/dual_faster_rcnn_r50_fpn_macl_m3fd.py --stats
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

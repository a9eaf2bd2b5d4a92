# Dual-stream Faster R-CNN (ResNet-50 FPN per modality, ImageNet init,
# ConcatConv fusion per FPN level) with the MACL cross-modal contrastive
# loss, on real LLVIP (data/LLVIP, see configs/_base_/datasets/llvip.py).
#   python tools/train.py configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py
#   torchrun --nproc_per_node=4 tools/train.py \
#       configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py --launcher pytorch
# The 1280x1024 JPEGs are decoded at 1/2 (reduced_decode in the dataset
# base) and the loading processes reuse the memory they free
# (KeepFreedMemory): ~2.5x the pairs/s per loader worker of a full decode +
# resize (benchmarks/README.md, 4b), same boxes, scale_factor and metrics.
_base_ = [
    '../_base_/models/dual_faster_rcnn_r50_fpn.py',
    '../_base_/datasets/llvip.py',
    './_base_/runtime_tensorboard.py',
    # every mmsafe guard with safe defaults (custom_imports, custom_hooks)
    '../_base_/safety_runtime.py',
]
custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)

# Normalisation of each modality. These are ImageNet's statistics (those of
# the backbones' init), NOT LLVIP's own: LLVIP's have not been computed for
# this file. Compute them on the released train split (a 1000-pair sample
# is enough) with
#   python tools/check_dataset.py \
#       configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py --stats \
#       --stats-samples 1000 --workers 8
# and replace the two lines below with the printed ones.
model = dict(
    data_preprocessor=dict(
        visible=dict(mean=[123.675, 116.28, 103.53],
                     std=[58.395, 57.12, 57.375], bgr_to_rgb=True),
        infrared=dict(mean=[123.675, 116.28, 103.53],
                      std=[58.395, 57.12, 57.375], bgr_to_rgb=True)))

# 12 epochs; after every epoch on the test split: pascal_voc/mAP (mAP50),
# coco/bbox_mAP (mAP50:95) and coco/bbox_mAP_50 (see the dataset base).
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
# NaN/Inf loss or gradient on any rank: all ranks skip the step together.
optim_wrapper = dict(
    type='NaNSkipOptimWrapper',
    optimizer=dict(type='SGD', lr=0.005, momentum=0.9, weight_decay=0.0001),
    clip_grad=dict(max_norm=35, norm_type=2))

# python tools/train.py ... --auto-scale-lr rescales lr to the real total
# batch size.
auto_scale_lr = dict(enable=False, base_batch_size=4)

# Expected bands of a healthy LLVIP run (from our users' runs): warn when
# grad_norm stays above 20, when mAP50 is below 0.52 after epoch 1; stop
# cleanly (checkpoint saved) when losses stay non-finite.
# The MACL check demands the MACL head, stops the run when loss_macl
# vanishes, goes constant or stops reaching the head, warns when loss_macl
# stays at its chance level after warm-up (pairing broken; the one judge of
# train/macl_chance_ratio, at its default threshold 0.95) and runs the
# shuffled-pair control (judged after warm-up).
custom_hooks = [
    dict(hook, required=True, policy='raise', chance_warmup=500,
         control_interval=50, control_warmup=500)
    if hook['type'] == 'MACLCheckHook' else hook
    for hook in _base_.custom_hooks
] + [
    dict(type='ScalarBandsHook', bands=[
        dict(key='grad_norm', max=20, action='warn', patience=20),
        dict(key='pascal_voc/mAP', min=0.52, after_epoch=1, action='warn'),
        dict(key='loss*', finite=True, action='stop', patience=3)]),
]

# CPU demo of the main job: the dual-stream Faster R-CNN with MACL on a
# deterministic synthetic LLVIP-like dataset, created on first use at
# data/llvip_synthetic (real LLVIP layout: 300 train + 100 test pairs of
# 160x128; people warm in infrared and dim in visible; some images without
# people). Trains to the end in a few minutes on 2 CPU cores:
#   python tools/train.py configs/llvip/demo_cpu.py
# and is watched in TensorBoard (work_dirs/demo_cpu/<time>/vis_data).
_base_ = [
    '../_base_/models/dual_faster_rcnn_r18w16_fpn_tiny.py',
    '../_base_/datasets/llvip.py',
    './_base_/runtime_tensorboard.py',
    # Safety runtime (guards and hooks), added here when available:
    # '../_base_/safety_runtime.py',
    # (then also optim_wrapper type='NaNSkipOptimWrapper' below)
]
custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)

data_root = 'data/llvip_synthetic/'
# Generation parameters; train and val must agree (one tree).
synthetic = dict(num_train=300, num_test=100, img_size=(160, 128), seed=0)
img_scale = (160, 128)

train_pipeline = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedResize', scale=img_scale, keep_ratio=True),
    dict(type='PairedRandomFlip', prob=0.5),
    dict(type='PackPairedDetInputs')
]
test_pipeline = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='PairedResize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackPairedDetInputs',
        meta_keys=('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                   'img_shape', 'scale_factor'))
]

train_dataloader = dict(
    batch_size=4,
    # tiny images: loading in the main process is cheapest on 2 cores
    num_workers=0,
    persistent_workers=False,
    batch_sampler=None,
    dataset=dict(
        data_root=data_root,
        synthetic=synthetic,
        pipeline=train_pipeline,
        # keep the images without people: the detector must learn them too
        filter_cfg=None))
val_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root, synthetic=synthetic, pipeline=test_pipeline))
test_dataloader = val_dataloader

# The synthetic task is easy: mAP50 is above 0.9 after 3 epochs.
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=5, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=50),
    dict(type='CosineAnnealingLR', begin=0, end=5, by_epoch=True,
         eta_min_ratio=0.05, convert_to_iter_based=True)
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.002, weight_decay=0.0001),
    clip_grad=dict(max_norm=10, norm_type=2))

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=1))
randomness = dict(seed=0)

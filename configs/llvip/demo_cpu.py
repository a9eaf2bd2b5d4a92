# CPU demo of the main job: the dual-stream Faster R-CNN with MACL on a
# deterministic synthetic LLVIP-like dataset, created on first use at
# data/llvip_synthetic_demo (real LLVIP layout: 300 train + 100 test pairs
# of 160x128; people warm in infrared and dim in visible; a quarter of the
# images without people). Trains to the end in a few minutes on 2 CPU cores:
#   python tools/train.py configs/llvip/demo_cpu.py
# and is watched in TensorBoard (work_dirs/demo_cpu/<time>/vis_data).
_base_ = [
    '../_base_/models/dual_faster_rcnn_r18w16_fpn_tiny.py',
    '../_base_/datasets/llvip.py',
    './_base_/runtime_tensorboard.py',
    # every mmsafe guard with safe defaults (custom_imports, custom_hooks)
    '../_base_/safety_runtime.py',
]
custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)

data_root = 'data/llvip_synthetic_demo/'
# Generation parameters; train and val must agree (one tree). People of
# 30-110 px in 160x128 images: what a pair shares globally (how many people,
# how large) is then enough for MACL's pooled embeddings to tell the pairs
# of a batch apart; with the generator's default small people (14-60 px)
# and independent backgrounds, loss_macl stays at chance level ln(B).
synthetic = dict(
    num_train=300, num_test=100, img_size=(160, 128), seed=0,
    max_people=5, empty_ratio=0.25, person_height=(30, 110))
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

# MACL: max-pooled last FPN level, and a weight that lets it learn within
# the few hundred iterations of the demo.
model = dict(macl_head=dict(pooling='max', loss_weight=0.5))

# The detection task is easy (mAP50 above 0.9 after 3 epochs); MACL needs
# a few hundred iterations to get below chance level.
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=8, val_interval=2)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=50),
    dict(type='CosineAnnealingLR', begin=0, end=8, by_epoch=True,
         eta_min_ratio=0.05, convert_to_iter_based=True)
]
# NaN/Inf loss or gradient on any rank: all ranks skip the step together.
optim_wrapper = dict(
    type='NaNSkipOptimWrapper',
    optimizer=dict(type='AdamW', lr=0.002, weight_decay=0.0001),
    clip_grad=dict(max_norm=10, norm_type=2))

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='CheckpointHook', interval=2, max_keep_ckpts=1))
randomness = dict(seed=0)

# MACL is what this config is for: the check demands the MACL head
# (required), stops the run when loss_macl vanishes, goes constant or stops
# reaching the head (policy='raise'), and runs the shuffled-pair control.
# The tiny demo model leaves MACL's chance level after about 200 iterations
# (loss_macl / ln(B) ends near 0.5-0.75): chance and control are judged
# after that.
custom_hooks = [
    dict(hook, required=True, policy='raise', chance_warmup=250,
         control_interval=50, control_warmup=250)
    if hook['type'] == 'MACLCheckHook' else hook
    for hook in _base_.custom_hooks
]

# Runtime of the LLVIP configs: MMDetection's default hooks, TensorBoard and
# local scalars under train/ and val/ (train/loss, train/loss_macl,
# train/grad_norm, train/lr, val/pascal_voc/mAP, ...).
# custom_imports (mmsafe) is set by the leaf configs: the safety runtime
# fragment sets it too, and two bases may not share a key.
# mmsafe's scope: plain type names find mmsafe's classes first (the dataset,
# transforms and model), then MMDetection's and MMEngine's. A project that
# registers its own classes of the same names reaches them as mmdet.<Name>.
default_scope = 'mmsafe'

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=10),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(
        type='CheckpointHook', interval=1, max_keep_ckpts=3,
        save_best='pascal_voc/mAP', rule='greater'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='DetVisualizationHook'))

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    # without CUDA, mmsafe switches to gloo (and says so)
    dist_cfg=dict(backend='nccl'))

vis_backends = [
    dict(type='LocalVisBackend'),
    dict(type='TensorboardVisBackend'),
]
visualizer = dict(
    type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
# log_with_hierarchy: scalars are written as train/<key> and val/<key>.
log_processor = dict(
    type='LogProcessor', window_size=10, by_epoch=True,
    log_with_hierarchy=True)

log_level = 'INFO'
load_from = None
resume = False

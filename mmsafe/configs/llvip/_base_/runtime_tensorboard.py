# Runtime of the LLVIP configs, pure-Python style: MMDetection's default
# hooks, TensorBoard and local scalars under train/ and val/. Text twin:
# configs/llvip/_base_/runtime_tensorboard.py.
from mmdet.engine.hooks import DetVisualizationHook
from mmdet.visualization import DetLocalVisualizer
from mmengine.hooks import (CheckpointHook, DistSamplerSeedHook, IterTimerHook,
                            LoggerHook, ParamSchedulerHook)
from mmengine.runner import LogProcessor
from mmengine.visualization import LocalVisBackend, TensorboardVisBackend

default_scope = 'mmsafe'

default_hooks = dict(
    timer=dict(type=IterTimerHook),
    logger=dict(type=LoggerHook, interval=10),
    param_scheduler=dict(type=ParamSchedulerHook),
    checkpoint=dict(
        type=CheckpointHook, interval=1, max_keep_ckpts=3,
        save_best='pascal_voc/mAP', rule='greater'),
    sampler_seed=dict(type=DistSamplerSeedHook),
    visualization=dict(type=DetVisualizationHook))

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'))

vis_backends = [
    dict(type=LocalVisBackend),
    dict(type=TensorboardVisBackend),
]
visualizer = dict(
    type=DetLocalVisualizer, vis_backends=vis_backends, name='visualizer')
log_processor = dict(
    type=LogProcessor, window_size=10, by_epoch=True,
    log_with_hierarchy=True)

log_level = 'INFO'
load_from = None
resume = False

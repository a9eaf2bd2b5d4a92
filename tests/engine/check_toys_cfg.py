"""Config text for the check-hook tests (toy paired task, real Runner)."""
import os.path as osp
from typing import Optional

from tests.utils import write_config


def toy_config(tmp_dir: str,
               name: str,
               custom_hooks: str,
               model: str = '',
               pairing: str = 'aligned',
               max_iters: int = 40,
               max_epochs: Optional[int] = None,
               val_interval: int = 1000,
               metric: str = 'ToyAccuracy',
               lr: float = 0.01,
               optim_extra: str = '',
               batch_size: int = 8,
               extra: str = '') -> str:
    """Write a runnable config and return its path.

    ``max_epochs`` selects ``EpochBasedTrainLoop`` (else iteration based);
    ``model`` holds extra ``ToyPairModel`` arguments as ``k=v, ...`` text.
    """
    if max_epochs is None:
        train_cfg = (f"dict(type='IterBasedTrainLoop', max_iters={max_iters},"
                     f' val_interval={val_interval})')
        by_epoch = False
        # an iteration loop over a finite sampler waits 2 s at the end of
        # each pass over the data (MMEngine's _InfiniteDataloaderIterator)
        sampler = 'InfiniteSampler'
    else:
        train_cfg = (f"dict(type='EpochBasedTrainLoop', "
                     f'max_epochs={max_epochs}, val_interval={val_interval})')
        by_epoch = True
        sampler = 'DefaultSampler'
    work_dir = osp.join(tmp_dir, name)
    text = f'''
default_scope = 'mmdet'
custom_imports = dict(imports=['mmsafe', 'tests.engine.check_toys'],
                      allow_failed_imports=False)
work_dir = {work_dir!r}
randomness = dict(seed=0)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
model = dict(type='ToyPairModel', {model})
model_wrapper_cfg = dict(type='MMDistributedDataParallel',
                         find_unused_parameters=True)
train_dataloader = dict(
    batch_size={batch_size}, num_workers=0,
    sampler=dict(type={sampler!r}, shuffle=True),
    dataset=dict(type='ToyPairDataset', num_samples=64,
                 pairing={pairing!r}))
val_dataloader = dict(
    batch_size=2, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='ToyPairDataset', num_samples=11))
val_evaluator = dict(type={metric!r})
val_cfg = dict(type='ValLoop')
train_cfg = {train_cfg}
optim_wrapper = dict(optimizer=dict(type='Adam', lr={lr}){optim_extra})
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=5),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=100000,
                    by_epoch={by_epoch}, save_last=False),
    sampler_seed=dict(type='DistSamplerSeedHook'))
log_processor = dict(by_epoch={by_epoch})
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='Visualizer', vis_backends=vis_backends)
log_level = 'INFO'
custom_hooks = {custom_hooks}
{extra}
'''
    return write_config(osp.join(tmp_dir, f'{name}.py'), text)

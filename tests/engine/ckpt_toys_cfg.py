"""Config text and log helpers shared by the checkpoint and safety report
tests (no imports of mmsafe here, so test modules can share them)."""
import glob
import os.path as osp

TOY_CONFIG = """
default_scope = 'mmdet'
custom_imports = dict(imports=['mmsafe', 'tests.engine.ckpt_toys'],
                      allow_failed_imports=False)
model = dict(type='CkptToyRegressor')
train_dataloader = dict(
    batch_size=2, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(type='CkptToyDataset', length=8))
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs={max_epochs})
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9))
param_scheduler = [dict(type='MultiStepLR', milestones=[2], by_epoch=True)]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=1),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=1,
                    max_keep_ckpts={max_keep}))
custom_hooks = {custom_hooks}
env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
"""


def latest_log(work_dir):
    """Rank 0's log file of the newest run in ``work_dir`` (with 2 ranks the
    console output can interleave mid-line)."""
    logs = sorted(glob.glob(osp.join(work_dir, '*', '*.log')))
    with open(logs[-1], encoding='utf-8') as f:
        return f.read()

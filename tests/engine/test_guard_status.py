"""Each guard says what it could check in a run (active, partial or
inactive) and, when it cannot see what it needs, says so once at
start-up: a single-image model under MMEngine's own Runner with its plain
optim wrapper, in process (tests/test_project_guards.py has the paired
project's statuses)."""
import json
import os.path as osp
import uuid

from mmsafe.engine.guard_status import status_of, summary_line
from tests.utils import logged_messages


def test_a_single_image_model_gets_each_guard_s_status(tmp_path):
    from mmengine.config import Config
    from mmengine.runner import Runner

    import mmsafe  # noqa: F401
    import tests.engine.step_toys  # noqa: F401
    name = f'status_{uuid.uuid4().hex[:8]}'
    cfg = Config(dict(
        default_scope='mmdet', experiment_name=name,
        work_dir=str(tmp_path / 'work'),
        env_cfg=dict(dist_cfg=dict(backend='nccl')),  # MMEngine 0.7
        model=dict(type='StepToyDetector'),
        train_dataloader=dict(
            batch_size=2, num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=False),
            dataset=dict(type='StepToyDataset', num_samples=8)),
        train_cfg=dict(by_epoch=False, max_iters=3),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[dict(type='FirstBatchStatsHook', max_vis=0),
                      dict(type='MACLCheckHook'),
                      dict(type='EmptyBatchSyncHook'),
                      dict(type='EvalCoverageHook'),
                      dict(type='SafetyReportHook')],
        log_level='INFO'))
    runner = Runner.from_cfg(cfg)
    with logged_messages() as messages:
        runner.train()
    text = '\n'.join(messages)
    # said once each, naming what was looked for and what to declare
    assert text.count('the pairing checks (identical, swapped or blank '
                      'modality; mirrored, shifted or unrelated infrared '
                      'image; per-box offsets) are off for this run') == 1
    assert "a data-sample field ['infrared_img'" in text
    assert 'mmsafe_modalities' in text
    assert text.count('the MACL checks are off') == 1
    assert text.count('the pair-geometry check is off') == 1
    with open(osp.join(runner.work_dir, 'safety_report.json')) as f:
        report = json.load(f)
    guards = report['guards']
    states = {name: entry['status'] for name, entry in guards.items()}
    assert states == {
        'Runner': 'inactive', 'NaN/Inf step skip': 'inactive',
        'FirstBatchStatsHook': 'partial', 'MACLCheckHook': 'inactive',
        'EmptyBatchSyncHook': 'active', 'EvalCoverageHook': 'inactive'}, \
        guards
    checks = guards['FirstBatchStatsHook']['checks']
    assert checks['statistics']['status'] == 'active'
    assert checks['pairing content']['status'] == 'inactive'
    assert "runner_type = 'SafeRunner'" in guards['Runner']['detail']
    assert 'NaNSkipOptimWrapper' in guards['NaN/Inf step skip']['detail']
    assert report['modalities']['model_inputs'] == (
        'visible=inputs (recognised: 3-channel inputs and no infrared '
        'image), infrared=not found')


def test_inputs_nothing_recognises_are_said_not_crashed_on(tmp_path):
    """A model fed a dict of keys nobody recognises: the first-batch
    statistics say what they looked for, and the run trains on."""
    import torch
    import torch.nn as nn
    from mmengine.config import Config
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    from torch.utils.data import Dataset

    from mmdet.registry import DATASETS, MODELS

    @DATASETS.register_module(force=True)
    class OddKeysDataset(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return dict(inputs=dict(a=torch.rand(3, 4, 4),
                                    b=torch.rand(3, 4, 4)))

    @MODELS.register_module(force=True)
    class OddKeysModel(BaseModel):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, inputs, data_samples=None, mode='tensor'):
            loss = (torch.stack(inputs['a']).mean() * self.w) ** 2
            return dict(loss=loss) if mode == 'loss' else loss

    import mmsafe  # noqa: F401
    cfg = Config(dict(
        default_scope='mmdet', experiment_name=f'odd_{uuid.uuid4().hex}',
        work_dir=str(tmp_path / 'work'),
        env_cfg=dict(dist_cfg=dict(backend='nccl')),  # MMEngine 0.7
        model=dict(type='OddKeysModel'),
        train_dataloader=dict(
            batch_size=2, num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=False),
            dataset=dict(type='OddKeysDataset')),
        train_cfg=dict(by_epoch=False, max_iters=2),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        custom_hooks=[dict(type='FirstBatchStatsHook')], log_level='INFO'))
    runner = Runner.from_cfg(cfg)
    with logged_messages() as messages:
        runner.train()
    text = '\n'.join(messages)
    assert text.count('FirstBatchStatsHook: no image was found in the batch '
                      "or in what the model receives (a dict of ['a', "
                      "'b']") == 1, text
    hook = [h for h in runner.hooks
            if type(h).__name__ == 'FirstBatchStatsHook'][0]
    status = hook.guard_status(runner)
    assert status['status'] == 'inactive', status


def test_status_of_checks_and_the_summary_line():
    active = dict(status='active', detail='a')
    off = dict(status='inactive', detail='b')
    assert status_of(dict(x=active))['status'] == 'active'
    assert status_of(dict(x=off, y=off))['status'] == 'inactive'
    mixed = status_of(dict(x=active, y=off))
    assert mixed['status'] == 'partial'
    assert mixed['detail'] == 'x: active; y: inactive'
    line = summary_line(dict(A=active, B=mixed, C=off))
    assert line.startswith('1 active, 1 partial, 1 inactive | partial: B (')
    assert line.endswith('inactive: C (b)')

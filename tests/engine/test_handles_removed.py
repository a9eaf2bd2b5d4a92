"""Every handle a component registers is removed when its run ends.

The CPU demo detector trains 4 iterations with every guard of
``configs/_base_/safety_runtime.py`` and ``NaNSkipOptimWrapper``;
:class:`tests.engine.handle_toys.HandleCensusHook` (last of all hooks)
counts the module hooks of the model, the optimizer's step hooks, the
signal handlers and mmsafe's threads before the run (first of all hooks),
after the first iteration and after the run.
"""
import json
import os.path as osp

import pytest

from tests.utils import REPO_ROOT, run_train, write_config

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')

CONFIG = """
_base_ = [{demo!r}]
custom_imports = dict(imports=['mmsafe', 'tests.engine.handle_toys'],
                      allow_failed_imports=False)
work_dir = {work_dir!r}
synthetic = dict(num_train=8, num_test=2, img_size=(160, 128), seed=0,
                 max_people=3, empty_ratio=0.5, person_height=(30, 110))
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root={data_root!r}, synthetic=synthetic))
val_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root={data_root!r}, synthetic=synthetic))
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=4,
                 val_interval=100000)
optim_wrapper = dict(type='NaNSkipOptimWrapper')
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=2),
    checkpoint=dict(type='CheckpointHook', interval=100000))
custom_hooks = _base_.custom_hooks + [dict(type='HandleCensusStartHook'),
                                      dict(type='HandleCensusHook')]
"""


@pytest.mark.slow
def test_a_run_leaves_no_handle_behind(tmp_path):
    work_dir = str(tmp_path / 'work')
    cfg = write_config(str(tmp_path / 'cfg.py'), CONFIG.format(
        demo=DEMO, work_dir=work_dir, data_root=str(tmp_path / 'llvip') + '/'))
    result = run_train(cfg, timeout=300)
    assert not result.timed_out and result.returncode == 0, result
    with open(osp.join(work_dir, 'handle_census.json')) as f:
        counts = json.load(f)
    before, during, after = counts['before'], counts['during'], \
        counts['after']
    # the census sees the guards' handles while training ...
    assert during['module_hooks'] > before['module_hooks'], counts
    assert during['signals'] != before['signals'], counts
    assert 'mmsafe-hang-watchdog' in during['threads'], counts
    # ... and none of them once the run ended
    assert after['module_hooks'] == before['module_hooks'], counts
    assert after['optimizer_hooks'] == before['optimizer_hooks'], counts
    assert after['signals'] == before['signals'], counts


@pytest.mark.slow
def test_a_finished_run_leaves_no_loader_worker_running(tmp_path):
    """An iteration loop starts the next round's loader workers before it
    uses the last batch; at the end of the run SafeRunner stops them, so
    the interpreter's exit does not have to (multiprocessing would
    terminate them, and torch would report "DataLoader worker ... is killed
    by signal" after a run that ended well)."""
    import multiprocessing

    from mmengine.config import Config

    from mmsafe.tools_lib.cli import build_runner
    work_dir = str(tmp_path / 'work')
    text = CONFIG.format(demo=DEMO, work_dir=work_dir,
                         data_root=str(tmp_path / 'llvip') + '/')
    text = text.replace('batch_size=2, num_workers=0, persistent_workers='
                        'False,\n    dataset=dict(data_root', 'batch_size=2, '
                        'num_workers=2, persistent_workers=False,\n    '
                        'dataset=dict(data_root', 1)
    assert 'num_workers=2' in text
    cfg = Config.fromfile(write_config(str(tmp_path / 'cfg.py'), text))
    before = set(multiprocessing.active_children())
    runner = build_runner(cfg)
    runner.train()
    left = [p for p in multiprocessing.active_children() if p not in before]
    assert left == [], left

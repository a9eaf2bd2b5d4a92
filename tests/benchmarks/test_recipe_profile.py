"""benchmarks/recipe_profile.py: what each arm's config changes, the split
table, and a short run of two arms of the CPU demo through tools/train.py
with the stage profile hooks."""
import glob
import json
import os.path as osp
import re
import sys

import pytest
from mmengine.config import Config

from benchmarks.recipe_profile import (arm_config, iterations, parse_args,
                                       split_table)
from tests.utils import REPO_ROOT, run_command

# the scripts (launchers, benchmarks), the planner and the docs do not
# depend on the stack: run at one end (tests/conftest.py)
pytestmark = pytest.mark.one_end

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')


def _args(tmp_path, *extra):
    return parse_args(['--data-dir', str(tmp_path / 'tree'), '--work-dir',
                       str(tmp_path / 'wd'), '--warmup', '1', '--timed', '2',
                       '--split', '1', '--count', '1', *extra])


def _config(arm, args):
    return Config.fromfile(arm_config(arm, args))


def test_the_recipe_arm_is_the_recipe_with_the_profile_hooks(tmp_path):
    args = _args(tmp_path)
    cfg = _config('recipe', args)
    recipe = Config.fromfile(args.config)
    assert cfg.runner_type == recipe.runner_type == 'SafeRunner'
    assert cfg.optim_wrapper.type == recipe.optim_wrapper.type
    hooks = [h['type'] for h in cfg.custom_hooks]
    assert hooks == [h['type'] for h in recipe.custom_hooks] + [
        'StageProfileHook', 'StageProfileEndHook']
    assert 'benchmarks.stage_profile_hook' in cfg.custom_imports.imports
    assert cfg.train_dataloader.batch_size == 4
    # 1 + 2 + 1 + 1 + 5 (profiled, on CUDA) iterations in one loop, the
    # loader cycling through the tree
    assert iterations(args) == 10
    assert cfg.train_cfg == dict(type='IterBasedTrainLoop', max_iters=10,
                                 val_interval=10)
    assert cfg.train_dataloader.sampler.type == 'InfiniteSampler'
    assert cfg.train_dataloader.dataset.data_root == \
        str(tmp_path / 'tree') + '/'
    assert cfg.env_cfg.cudnn_benchmark is False
    assert not cfg.model.get('channels_last', False)
    assert cfg.model.backbone.init_cfg is None


def test_levers_change_what_they_name(tmp_path):
    args = _args(tmp_path)
    cfg = _config('no-guards+cudnn+channels_last+batch8+pin+workers4', args)
    assert cfg.runner_type == 'Runner'
    assert [h['type'] for h in cfg.custom_hooks] == [
        'StageProfileHook', 'StageProfileEndHook']
    assert cfg.optim_wrapper.type == 'OptimWrapper'
    assert cfg.env_cfg.cudnn_benchmark is True
    assert cfg.model.channels_last is True
    assert cfg.train_dataloader.batch_size == 8
    # the learning rate follows MMEngine's linear rule from the recipe's
    # base batch size
    assert cfg.auto_scale_lr == dict(enable=True, base_batch_size=4)
    assert cfg.train_dataloader.pin_memory is True
    assert cfg.model.data_preprocessor.non_blocking is True
    assert cfg.train_dataloader.num_workers == 4


def test_levers_that_cannot_apply_are_refused(tmp_path):
    with pytest.raises(SystemExit, match='unknown lever'):
        _args(tmp_path, '--arms', 'recipe', 'cudnn+turbo')
    with pytest.raises(SystemExit, match='--no-amp'):
        arm_config('bf16', _args(tmp_path, '--no-amp'))
    from mmsafe.compat import sgd_has_fused
    if sgd_has_fused():
        cfg = _config('fused', _args(tmp_path))
        assert cfg.optim_wrapper.optimizer.fused is True
    else:
        with pytest.raises(SystemExit, match='no fused step'):
            arm_config('fused', _args(tmp_path))


def test_split_table_derives_the_rest_of_the_forward_and_the_guards():
    split = [{'train_step': dict(host_ms=100.0, device_ms=90.0),
              'visible backbone': dict(host_ms=20.0, device_ms=30.0),
              'backward': dict(host_ms=50.0, device_ms=40.0),
              'guard MACLCheckHook': dict(host_ms=2.0, device_ms=0.0),
              'guard RankFaultHook': dict(host_ms=1.0, device_ms=0.0)},
             {'train_step': dict(host_ms=120.0, device_ms=110.0),
              'visible backbone': dict(host_ms=40.0, device_ms=50.0),
              'backward': dict(host_ms=50.0, device_ms=40.0),
              'guard MACLCheckHook': dict(host_ms=4.0, device_ms=0.0),
              'guard RankFaultHook': dict(host_ms=1.0, device_ms=0.0)}]
    table = split_table(split)
    assert table['train_step'] == dict(host_ms=110.0, device_ms=100.0)
    assert table['forward, rest'] == dict(host_ms=30.0, device_ms=20.0)
    assert table['guards (mmsafe hooks), total'] == dict(host_ms=4.0,
                                                         device_ms=0.0)


def test_two_arms_of_the_demo_side_by_side(tmp_path):
    """The CPU demo (every guard) and the same model without guards,
    channels-last, 8 pairs a step: each arm's windows measured, the model's
    parts timed, host syncs counted by origin."""
    result = run_command(
        [sys.executable, 'benchmarks/recipe_profile.py', '--config', DEMO,
         '--device', 'cpu', '--no-amp', '--img-size', '160', '128',
         '--test', '2', '--warmup', '1', '--timed', '2', '--split', '1',
         '--count', '1', '--arms', 'recipe', 'no-guards+channels_last+batch8',
         '--data-dir', str(tmp_path / 'tree'), '--work-dir',
         str(tmp_path / 'wd')], timeout=420)
    out = result.output
    assert not result.timed_out and result.returncode == 0, out[-4000:]
    assert 'recipe profile: OK' in out
    number = r'[0-9]+\.[0-9]+'
    assert len(re.findall(rf'paired samples/s: {number}; s/iteration: '
                          rf'{number}; data wait: {number}', out)) == 2
    assert re.search(rf'vs recipe: {number}x paired samples/s', out)
    match = re.search(r'runner SafeRunner, .* channels-last weights 0/\d+, '
                      r'(\d+) mmsafe hooks, batch 4', out)
    assert match and int(match.group(1)) >= 8, out[-4000:]
    match = re.search(r'runner Runner, optim wrapper OptimWrapper, '
                      r'cudnn_benchmark False, channels-last weights '
                      r'(\d+)/(\d+), 0 mmsafe hooks, batch 8', out)
    assert match and match.group(1) == match.group(2) != '0', out[-4000:]
    profiles = {}
    for path in glob.glob(str(tmp_path / 'wd' / '*' / 'round0' /
                              'stage_profile.json')):
        with open(path, encoding='utf-8') as f:
            profiles[osp.basename(osp.dirname(osp.dirname(path)))] = \
                json.load(f)
    assert set(profiles) == {'recipe', 'no-guards_channels_last_batch8'}
    on, off = profiles['recipe'], profiles['no-guards_channels_last_batch8']
    for profile, batch in ((on, 4), (off, 8)):
        assert profile['pairs'] == 2 * batch and profile['pairs_per_s'] > 0
        assert len(profile['data_wait_ms']) == 1
        parts = set(profile['split'][0])
        assert {'visible backbone', 'infrared backbone', 'necks', 'fusion',
                'RPN head (loss)', 'RoI head (loss)', 'MACL head (loss)',
                'backward', 'optimizer step', 'train_step'} <= parts
        # MMDetection's target assignment and MMEngine's logging convert
        # tensors to Python numbers in every step
        kinds = profile['conversions_by_kind']
        assert kinds.get('model (MMDetection)', 0) > 0, kinds
        assert kinds.get('MMEngine', 0) > 0, kinds
        assert 'gpu_busy' not in profile  # no profiled window on CPU
    assert any(p.startswith('guard ') for p in on['split'][0])
    assert not any(p.startswith('guard ') for p in off['split'][0])
    assert 'MACLCheckHook' in on['guards'] and off['guards'] == []


def test_gpu_busy_fraction_is_the_union_of_kernel_intervals():
    """Overlapping kernels count once, CPU events not at all."""
    from types import SimpleNamespace

    import torch

    from benchmarks.stage_profile_hook import _busy_fraction
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(kind, start, end):
        return SimpleNamespace(device_type=kind, time_range=SimpleNamespace(
            start=start, end=end))

    prof = SimpleNamespace(events=lambda: [
        event(cuda, 10, 30), event(cuda, 20, 40), event(cpu, 0, 100),
        event(cuda, 60, 70)])
    assert _busy_fraction(prof, 100.0) == 0.4
    assert _busy_fraction(SimpleNamespace(
        events=lambda: [event(cpu, 0, 5)]), 100.0) is None

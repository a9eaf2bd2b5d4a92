"""tools/train.py, tools/test.py and the Linux launcher, run for real on the
CPU demo config shrunk to a few iterations."""
import glob
import json
import os.path as osp
import sys

import pytest

from tests.utils import REPO_ROOT, run_command, run_train

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')


def shrink(data_root, epochs=1, train_items=8, val_items=4):
    # val_interval=1: MMEngine 0.7 validates after the last epoch only at
    # an interval (0.8+ always)
    opts = [] if epochs is None else [f'train_cfg.max_epochs={epochs}',
                                      'train_cfg.val_interval=1']
    for loader, items in (('train_dataloader', train_items),
                          ('val_dataloader', val_items),
                          ('test_dataloader', val_items)):
        opts += [f'{loader}.dataset.data_root={data_root}',
                 f'{loader}.dataset.synthetic.num_train=16',
                 f'{loader}.dataset.synthetic.num_test=8',
                 f'{loader}.dataset.indices={items}']
    return opts


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('train_cli')
    work_dir = str(tmp / 'work')
    data_root = str(tmp / 'llvip') + '/'
    result = run_train(DEMO, timeout=600, args=[
        '--work-dir', work_dir, '--cfg-options',
        *shrink(data_root)])
    return result, work_dir, data_root


def test_train_writes_checkpoint_and_tensorboard_scalars(trained):
    result, work_dir, _ = trained
    assert result.returncode == 0, result
    assert osp.exists(osp.join(work_dir, 'epoch_1.pth'))
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        assert f.read().strip().endswith('epoch_1.pth')
    events = glob.glob(osp.join(work_dir, '*', 'vis_data',
                                'events.out.tfevents.*'))
    assert events, 'no TensorBoard event file'
    scalars = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    assert scalars
    # MMEngine 0.7 writes the validation scalars to their own json file
    records = []
    for path in glob.glob(osp.join(work_dir, '*', 'vis_data', '*.json')):
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    keys = set().union(*records)
    for key in ('loss', 'loss_macl', 'loss_cls', 'loss_bbox', 'lr'):
        assert key in keys or f'train/{key}' in keys, (key, keys)
    assert any('pascal_voc/mAP' in k for k in keys), keys


def test_test_py_evaluates_the_checkpoint(trained, tmp_path):
    """On a machine with the test split only: tools/test.py (every guard of
    the demo on) must not build the training dataset."""
    _, work_dir, data_root = trained
    test_py = osp.join(REPO_ROOT, 'tools', 'test.py')
    opts = shrink(data_root, epochs=None) + [
        f'train_dataloader.dataset.data_root={tmp_path}/no_train_data/',
        'train_dataloader.dataset.synthetic=None']
    result = run_command(
        [sys.executable, test_py, DEMO, osp.join(work_dir, 'epoch_1.pth'),
         '--work-dir', osp.join(work_dir, 'test'), '--cfg-options', *opts],
        timeout=600)
    assert result.returncode == 0, result
    assert 'pascal_voc/mAP' in result.output


def test_preflight_refuses_a_broken_config_before_training(tmp_path):
    work_dir = str(tmp_path / 'work')
    result = run_train(DEMO, timeout=300, args=[
        '--preflight', '--work-dir', work_dir, '--cfg-options',
        *shrink(str(tmp_path / 'llvip') + '/'),
        'train_dataloader.persistent_workers=True'])
    assert result.returncode != 0, result
    assert 'persistent_workers' in result.output
    assert '--ignore-preflight-errors' in result.output
    assert not glob.glob(osp.join(work_dir, '*.pth'))


def test_linux_launcher_shows_log_tail_on_failure(tmp_path):
    work_dir = str(tmp_path / 'work')
    from tests.utils import free_port
    launcher = osp.join(REPO_ROOT, 'tools', 'train_with_tensorboard.sh')
    result = run_command(
        ['bash', launcher, DEMO, str(free_port()), work_dir,
         '--cfg-options', *shrink(str(tmp_path / 'llvip') + '/'),
         'model.backbone.type=NoSuchBackbone'],
        timeout=600, env=dict(MMSAFE_NO_BROWSER='1'))
    assert result.returncode != 0
    assert 'training FAILED' in result.output
    assert 'NoSuchBackbone' in result.output


def test_amp_flag_trains_the_demo_on_cpu(tmp_path):
    work_dir = str(tmp_path / 'work')
    result = run_train(DEMO, timeout=600, args=[
        '--amp', '--work-dir', work_dir, '--cfg-options',
        *shrink(str(tmp_path / 'llvip') + '/')])
    assert result.returncode == 0, result
    assert 'AmpNaNSkipOptimWrapper' in result.output
    assert 'No inf checks were recorded' not in result.output
    assert osp.exists(osp.join(work_dir, 'epoch_1.pth'))

"""The CPU demo model under real 2-process gloo DDP, started as a user
starts it (tools/dist_train.sh CONFIG 2: torch.distributed.run, then
tools/train.py --launcher pytorch), with a hard timeout (a hang fails the
test)."""
import glob
import os
import os.path as osp
import sys

from tests.utils import REPO_ROOT, free_port, run_command, write_config

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
TIMEOUT = 900  # the shared CI/dev machine is slow; a hang still fails


def _scalar_tags(work_dir):
    from tensorboard.backend.event_processing.event_accumulator import \
        EventAccumulator
    files = glob.glob(osp.join(work_dir, '*', 'vis_data', 'events.out.*'))
    assert files, f'no TensorBoard event file under {work_dir}'
    tags = set()
    for path in files:
        acc = EventAccumulator(path)
        acc.Reload()
        tags |= set(acc.Tags()['scalars'])
    return tags


def test_demo_trains_under_two_process_gloo_ddp(tmp_path):
    work_dir = str(tmp_path / 'work')
    data_root = str(tmp_path / 'llvip_synthetic')
    small = dict(num_train=16, num_test=8)
    options = [
        'train_cfg.max_epochs=1',
        'train_cfg.val_interval=1',
        'train_dataloader.batch_size=2',
        'val_dataloader.batch_size=2',
        'default_hooks.checkpoint.interval=1',
        'default_hooks.logger.interval=2',
        # the other ranks' pairs are MACL negatives too: exercises the
        # all-gather under DDP
        'model.macl_head.gather_negatives=True',
    ]
    for loader in ('train_dataloader', 'val_dataloader'):
        options.append(f'{loader}.dataset.data_root={data_root}')
        for key, value in small.items():
            options.append(f'{loader}.dataset.synthetic.{key}={value}')
    # dist_train.sh calls `python`: the one running the tests comes first.
    env = dict(PORT=str(free_port()),
               PATH=osp.dirname(sys.executable) + os.pathsep +
               os.environ.get('PATH', ''))
    result = run_command(
        ['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), DEMO, '2',
         '--work-dir', work_dir, '--cfg-options', *options],
        timeout=TIMEOUT, env=env)
    assert not result.timed_out, result
    assert result.returncode == 0, result
    assert osp.isfile(osp.join(work_dir, 'epoch_1.pth')), result
    # 8 pairs per rank, batch 2: 4 iterations, every loss term logged
    assert 'Epoch(train) [1][4/4]' in result.output, result
    assert 'loss_macl' in result.output, result
    # SafeRunner started the group with gloo (the demo asks for nccl).
    assert '[mmsafe] CUDA is not available: using the gloo backend' in \
        result.output, result
    assert '[mmsafe] [mmsafe]' not in result.output, result
    assert 'pascal_voc/mAP' in result.output, result

    tags = _scalar_tags(work_dir)
    expected = {
        'train/loss', 'train/loss_cls', 'train/loss_bbox', 'train/loss_macl',
        'train/grad_norm', 'train/lr', 'val/pascal_voc/mAP'
    }
    assert expected <= tags, sorted(tags)


def test_demo_names_a_loss_term_that_vanishes_on_one_rank(tmp_path):
    """The demo detector under 2-rank DDP, ``loss_macl`` dropped on rank 1
    only (as a swallowed exception around it would): the run stops at
    once with DDP's unused-parameter error explained, naming rank,
    iteration, loss term and module, on rank 0's console and log and in
    ``safety_report.json``."""
    import json
    work_dir = str(tmp_path / 'work')
    data_root = str(tmp_path / 'llvip_synthetic')
    config = write_config(str(tmp_path / 'vanish.py'), f"""
        _base_ = [{DEMO!r}]
        custom_imports = dict(imports=['mmsafe', 'tests.models.demo_faults'],
                              allow_failed_imports=False)
        # vanishes in iteration 4
        model = dict(macl_head=dict(type='VanishingMACLHead', vanish_rank=1,
                                    vanish_at=4))
        synthetic = dict(num_train=24, num_test=4)
        train_dataloader = dict(
            batch_size=2, num_workers=0, persistent_workers=False,
            dataset=dict(data_root={data_root!r}, synthetic=synthetic))
        val_dataloader = dict(
            batch_size=2, num_workers=0, persistent_workers=False,
            dataset=dict(data_root={data_root!r}, synthetic=synthetic))
        test_dataloader = val_dataloader
        train_cfg = dict(max_epochs=1)
        default_hooks = dict(logger=dict(interval=2))
        """)
    result = run_command(
        [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
         '--master_addr=127.0.0.1', f'--master_port={free_port()}',
         osp.join(REPO_ROOT, 'tools', 'train.py'), config, '--launcher',
         'pytorch', '--work-dir', work_dir],
        timeout=TIMEOUT)
    assert not result.timed_out and result.returncode != 0, result
    out = result.output
    assert ('DDPParameterError: [mmsafe] DDP stopped: on rank 1, in '
            'iteration 4, the parameters of macl_head (13 parameters) got '
            'no gradient') in out, result
    assert ('Loss terms of rank 1 in iteration 4: loss_bbox, loss_cls, '
            'loss_rpn_bbox, loss_rpn_cls.') in out
    assert 'compared with its iterations 1-3: loss_macl missing.' in out
    logs = glob.glob(osp.join(work_dir, '*', '*.log'))
    with open(logs[0], encoding='utf-8') as f:
        log = f.read()
    assert ('[mmsafe] [from rank 1] rank 1, iteration 4: loss term '
            'loss_macl missing') in log
    assert '[mmsafe] rank 1 failed in iteration 4: DDPParameterError' in log
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        root = json.load(f)['root_cause']
    assert (root['rank'], root['iter'], root['missing'], root['modules']) \
        == (1, 4, ['loss_macl'], ['macl_head (13 parameters)'])

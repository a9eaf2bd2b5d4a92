"""The CPU demo model under real 2-process gloo DDP, started as a user
starts it (tools/dist_train.sh CONFIG 2: torch.distributed.run, then
tools/train.py --launcher pytorch), with a hard timeout (a hang fails the
test)."""
import glob
import os
import os.path as osp
import sys

from tests.utils import REPO_ROOT, free_port, run_command

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

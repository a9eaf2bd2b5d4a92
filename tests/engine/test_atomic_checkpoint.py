"""Atomic checkpoint writes and auto-resume that skips a broken checkpoint,
through tools/train.py."""
import glob
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest

from tests.engine.ckpt_toys_cfg import TOY_CONFIG, latest_log
from tests.utils import REPO_ROOT, TRAIN, run_train, write_config


def _config(tmp_path, max_epochs=3, max_keep=-1, custom_hooks='[]'):
    return write_config(
        str(tmp_path / 'toy.py'),
        TOY_CONFIG.format(max_epochs=max_epochs, max_keep=max_keep,
                          custom_hooks=custom_hooks))


def test_atomic_save_replaces_whole_file_or_nothing(tmp_path):
    """MMEngine's save_checkpoint with the 'atomic_local' file backend
    (what SafeRunner passes for a local folder)."""
    from mmengine.runner import save_checkpoint
    from mmengine.runner.checkpoint import _load_checkpoint

    from mmsafe.checkpoint import ATOMIC_BACKEND_ARGS
    path = str(tmp_path / 'iter_1.pth')

    def save(ckpt, filename):
        save_checkpoint(ckpt, filename, backend_args=ATOMIC_BACKEND_ARGS)

    save(dict(meta=dict(iter=1), state_dict={}), path)
    assert _load_checkpoint(path)['meta']['iter'] == 1

    class Unpicklable:

        def __reduce__(self):
            raise RuntimeError('disk full (simulated)')

    with pytest.raises(RuntimeError, match='disk full'):
        save(dict(meta=dict(iter=2), bad=Unpicklable()), path)
    # The failed save left the previous checkpoint intact and no temp file
    # (torch.save fails while filling the buffer: nothing was written).
    assert _load_checkpoint(path)['meta']['iter'] == 1
    assert os.listdir(tmp_path) == ['iter_1.pth']

    from mmsafe.checkpoint.atomic import AtomicLocalBackend
    backend = AtomicLocalBackend()
    with pytest.raises(OSError, match='pipe broken'):
        def failing_write(f):
            f.write(b'PK half')
            raise OSError('pipe broken (simulated)')
        from mmsafe.checkpoint import atomic_write
        atomic_write(path, failing_write)
    assert _load_checkpoint(path)['meta']['iter'] == 1
    assert os.listdir(tmp_path) == ['iter_1.pth']
    # A temp file of a killed writer (dead pid) is removed by the next save.
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    stale = tmp_path / f'.iter_3.pth.{dead.pid}.mmsafe-tmp'
    stale.write_bytes(b'PK partial')
    save(dict(meta=dict(iter=3), state_dict={}), str(tmp_path / 'iter_3.pth'))
    assert sorted(os.listdir(tmp_path)) == ['iter_1.pth', 'iter_3.pth']
    # Removing a checkpoint waits for the next complete one in its folder.
    backend.remove(str(tmp_path / 'iter_1.pth'))
    assert sorted(os.listdir(tmp_path)) == ['iter_1.pth', 'iter_3.pth']
    save(dict(meta=dict(iter=4), state_dict={}), str(tmp_path / 'iter_4.pth'))
    assert sorted(os.listdir(tmp_path)) == ['iter_3.pth', 'iter_4.pth']
    backend.put_text('iter_4.pth', str(tmp_path / 'last_checkpoint'))
    assert (tmp_path / 'last_checkpoint').read_text() == 'iter_4.pth'


def test_torn_last_checkpoint_pointer_falls_back_to_newest_loadable(
        tmp_path):
    """MMEngine writes last_checkpoint with a plain open(); a pointer cut
    short by a kill names no file, and auto-resume takes the newest
    checkpoint that loads."""
    import torch

    from mmsafe.checkpoint import find_latest_loadable_checkpoint
    hub = dict(log_scalars={}, runtime_info={}, resumed_keys={})
    for it in (1, 2):
        path = tmp_path / f'iter_{it}.pth'
        torch.save(dict(meta=dict(iter=it), state_dict={},
                        message_hub=hub), str(path))
        os.utime(path, (it, it))
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_'))
    assert find_latest_loadable_checkpoint(str(tmp_path)) == str(
        tmp_path / 'iter_2.pth')
    (tmp_path / 'last_checkpoint').write_text('')
    assert find_latest_loadable_checkpoint(str(tmp_path)) == str(
        tmp_path / 'iter_2.pth')


def test_truncated_newest_checkpoint_is_skipped_on_auto_resume(tmp_path):
    config = _config(tmp_path)
    work_dir = str(tmp_path / 'work')
    result = run_train(config, timeout=300, args=['--work-dir', work_dir])
    assert result.returncode == 0, result
    newest = osp.join(work_dir, 'epoch_3.pth')
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        assert f.read().strip() == newest
    size = osp.getsize(newest)
    with open(newest, 'r+b') as f:
        f.truncate(size // 2)

    # Without mmsafe, MMEngine resumes from what last_checkpoint names and
    # dies on the truncated file (its own local loader: SafeRunner replaces
    # the CheckpointLoader scheme in a process that built one).
    from mmengine.runner.checkpoint import load_from_local
    with pytest.raises(RuntimeError, match='zip archive'):
        load_from_local(newest, map_location=None)

    result = run_train(config, timeout=300, args=[
        '--work-dir', work_dir, '--resume', '--cfg-options',
        'train_cfg.max_epochs=4'])
    assert result.returncode == 0, result
    out = result.output
    assert f'Skipping checkpoint {newest} for auto-resume' in out, result
    assert 'resumed epoch: 2, iter: 8' in out, result
    assert 'Epoch(train) [3][4/4]' in out and 'Epoch(train) [4][4/4]' in out
    # The rerun of epoch 3 replaced the truncated file with a whole one.
    # mmsafe's data-only loader: MMEngine's _load_checkpoint reaches it only
    # in a process that built a SafeRunner, which depends on the tests that
    # ran before in this process.
    from mmsafe.checkpoint import load_checkpoint_file
    assert load_checkpoint_file(newest, map_location='cpu')['meta'][
        'epoch'] == 3
    from mmsafe.events import read_events
    skipped = read_events(work_dir, 'resume_skipped_checkpoint')
    assert [r['checkpoint'] for r in skipped] == [newest]
    assert skipped[0]['chosen'] == osp.join(work_dir, 'epoch_2.pth')


def test_truncated_newest_checkpoint_skipped_on_every_rank(tmp_path):
    """2-rank gloo: every rank picks the same older checkpoint."""
    config = _config(tmp_path, max_epochs=2)
    work_dir = str(tmp_path / 'work')
    result = run_train(config, nproc=2, timeout=400,
                       args=['--work-dir', work_dir])
    assert result.returncode == 0, result
    newest = osp.join(work_dir, 'epoch_2.pth')
    with open(newest, 'r+b') as f:
        f.truncate(100)
    result = run_train(config, nproc=2, timeout=400, args=[
        '--work-dir', work_dir, '--resume', '--cfg-options',
        'train_cfg.max_epochs=3'])
    # Rank 1 would have died on the truncated file had it not skipped it
    # too (MMEngine logs only rank 0's warnings).
    assert result.returncode == 0, result
    log = latest_log(work_dir)
    assert f'Skipping checkpoint {newest} for auto-resume' in log
    assert 'resumed epoch: 1, iter: 2' in log, log
    assert 'Epoch(train) [3][2/2]' in log, log


def test_no_loadable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    from mmsafe.checkpoint import \
        find_latest_loadable_checkpoint as find_latest_checkpoint
    path = tmp_path / 'epoch_1.pth'
    path.write_bytes(b'PK\x03\x04 not really a checkpoint')
    (tmp_path / 'last_checkpoint').write_text(str(path))
    with pytest.raises(RuntimeError, match='no checkpoint in .* loads'):
        find_latest_checkpoint(str(tmp_path))
    assert find_latest_checkpoint(str(tmp_path / 'empty')) is None


def _wait_for(path, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if osp.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def test_kill_during_save_then_resume(tmp_path):
    """kill -9 while epoch_2.pth is being written (slow storage simulated
    with a slow fsync), with max_keep_ckpts=1; resume continues from
    epoch_1."""
    hooks = "[dict(type='SlowCheckpointStorageHook', after_saves=1, " \
        "delay=300)]"
    config = _config(tmp_path, max_keep=1, custom_hooks=hooks)
    work_dir = str(tmp_path / 'work')
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1',
               PYTHONPATH=REPO_ROOT + os.pathsep +
               os.environ.get('PYTHONPATH', ''))
    log = open(tmp_path / 'killed.log', 'w')
    proc = subprocess.Popen(
        [sys.executable, TRAIN, config, '--work-dir', work_dir],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        started = _wait_for(osp.join(work_dir, 'slow_save_started'), proc,
                            timeout=300)
        # While epoch_2 is being written: epoch_1 (to be removed by
        # max_keep_ckpts=1) is still there and last_checkpoint names it.
        assert started, open(tmp_path / 'killed.log').read()[-4000:]
        assert osp.exists(osp.join(work_dir, 'epoch_1.pth'))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        log.close()
    assert proc.returncode == -signal.SIGKILL
    assert not osp.exists(osp.join(work_dir, 'epoch_2.pth'))
    temps = glob.glob(osp.join(work_dir, '.epoch_2.pth.*.mmsafe-tmp'))
    assert len(temps) == 1
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        assert f.read().strip() == osp.join(work_dir, 'epoch_1.pth')

    result = run_train(config, timeout=300, args=[
        '--work-dir', work_dir, '--resume', '--cfg-options',
        'custom_hooks.0.after_saves=1000'])
    assert result.returncode == 0, result
    assert 'resumed epoch: 1, iter: 4' in result.output, result
    assert 'Epoch(train) [3][4/4]' in result.output, result
    assert 'left by an interrupted checkpoint save' in result.output
    assert not glob.glob(osp.join(work_dir, '.*.mmsafe-tmp'))
    assert sorted(osp.basename(p) for p in glob.glob(
        osp.join(work_dir, '*.pth'))) == ['epoch_3.pth']

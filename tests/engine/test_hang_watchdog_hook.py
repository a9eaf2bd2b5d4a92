"""HangWatchdogHook: real Runner runs, single process and 2-rank gloo DDP.

Fault injection: a model whose forward sleeps past the watchdog at one
iteration (on every rank, or on rank 1 only under DDP).
"""
import os.path as osp
import re
import uuid

from mmsafe.events import read_events
from tests.engine.test_dataloader_probe_hook import _marked_processes
from tests.utils import run_train, write_config

HARD_TIMEOUT = 420

CONFIG = """
default_scope = 'mmdet'
custom_imports = dict(
    imports=['mmsafe', 'tests.engine.watchdog_toys'],
    allow_failed_imports=False)
model = dict(type='SleepyToyModel', {model})
train_dataloader = dict(
    batch_size=2, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='SleepyToyDataset', length=16))
train_cfg = dict(type='IterBasedTrainLoop', max_iters={iters})
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=1),
    checkpoint=dict(type='CheckpointHook', interval=1000, save_last=False))
custom_hooks = [dict(type='HangWatchdogHook', {watchdog})]
work_dir = '{work_dir}'
"""


def _run(tmp_path, model, watchdog, iters=5, nproc=1):
    work_dir = str(tmp_path / 'work')
    cfg = write_config(str(tmp_path / 'cfg.py'), CONFIG.format(
        model=model, watchdog=watchdog, iters=iters, work_dir=work_dir))
    mark = uuid.uuid4().hex
    result = run_train(cfg, nproc=nproc, timeout=HARD_TIMEOUT,
                       env=dict(MMSAFE_TEST_MARK=mark))
    result.work_dir = work_dir
    # No process of the run (ranks, launcher) outlives it, abort included.
    assert _marked_processes(mark) == []
    return result


def _read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def test_sleeping_forward_is_reported_and_run_recovers(tmp_path):
    result = _run(
        tmp_path, model='stall_iter=3, stall_seconds=12',
        watchdog='timeout=4, first_iter_timeout=60, poll_interval=0.5')
    assert result.returncode == 0, result
    path = osp.join(result.work_dir, 'hang_rank0.txt')
    assert osp.exists(path), result
    report = _read(path)
    assert report.count('mmsafe hang report') == 1
    assert 'rank 0 of 1' in report
    assert 'at iteration 3' in report
    assert "phase 'forward'" in report
    assert 'main thread is in _sleep_past_watchdog' in report
    # The stack names the sleeping function and its caller.
    assert re.search(r'in _sleep_past_watchdog\n\s+time\.sleep', report)
    assert 'in forward' in report
    # Also in the log, and progress resuming is noticed.
    assert 'mmsafe hang report' in result.output
    assert 'makes progress again' in result.output
    (event, ) = read_events(result.work_dir, 'hang')
    assert event['iter'] == 3 and event['phase'] == 'forward'
    # Reported during the stall (the stack above is inside it), before
    # progress resumed.
    assert result.output.index('mmsafe hang report') < \
        result.output.index('makes progress again')


def test_healthy_run_writes_no_report(tmp_path):
    result = _run(
        tmp_path, model='stall_iter=-1',
        watchdog='timeout=4, first_iter_timeout=60, poll_interval=0.5',
        iters=8)
    assert result.returncode == 0, result
    assert not osp.exists(osp.join(result.work_dir, 'hang_rank0.txt'))
    assert read_events(result.work_dir, 'hang') == []


def test_ddp_stalled_rank_shows_peer_waiting_in_collective(tmp_path):
    result = _run(
        tmp_path, nproc=2,
        model='stall_iter=3, stall_seconds=3600, stall_rank=1',
        watchdog='timeout=6, first_iter_timeout=120, poll_interval=0.5, '
        'abort_timeout=12')
    assert not result.timed_out, result
    assert result.returncode != 0, result
    # The default finite distributed timeout was applied.
    assert 'distributed timeout: 1800 s' in result.output
    rank1 = _read(osp.join(result.work_dir, 'hang_rank1.txt'))
    assert "phase 'forward'" in rank1 and 'at iteration 3' in rank1
    assert 'in _sleep_past_watchdog' in rank1
    rank0 = _read(osp.join(result.work_dir, 'hang_rank0.txt'))
    assert 'rank 0 of 2' in rank0 and 'at iteration 3' in rank0
    assert 'waits in a collective' in rank0
    assert 'DDP gradient all-reduce' in rank0
    assert 'backward' in rank0.split('--- thread')[1]  # main thread stack
    assert '_sleep_past_watchdog' not in rank0
    # A rank past its abort deadline exited with the watchdog's code (both
    # ranks wait, so which one is first is a race), and the launcher
    # stopped the job instead of letting it hang.
    aborts = read_events(result.work_dir, 'hang_abort')
    assert aborts and all(a['exit_code'] == 75 and a['iter'] == 3
                          for a in aborts)
    assert re.search(r'exitcode\s*:\s*75', result.output), result

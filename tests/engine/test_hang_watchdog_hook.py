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
{extra}
"""


def _run(tmp_path, model, watchdog, iters=5, nproc=1, extra=''):
    work_dir = str(tmp_path / 'work')
    cfg = write_config(str(tmp_path / 'cfg.py'), CONFIG.format(
        model=model, watchdog=watchdog, iters=iters, work_dir=work_dir,
        extra=extra))
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
        'abort_timeout=12', extra="runner_type = 'SafeRunner'")
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


def test_phases_come_from_hook_methods_and_pytorch_hooks(tmp_path):
    """The marks of one training iteration, and no handle left after the
    run (in process: a model and an optimizer, no loop)."""
    from types import SimpleNamespace

    import torch
    from mmengine.optim import OptimWrapper

    from mmsafe.engine.hooks import HangWatchdogHook
    model = torch.nn.Linear(4, 1)
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    runner = SimpleNamespace(model=model, optim_wrapper=wrapper, iter=0,
                             epoch=0, work_dir=str(tmp_path))
    hook = HangWatchdogHook(timeout=600, first_iter_timeout=600)
    hook.before_run(runner)
    hook.before_train(runner)
    phases = [hook._hb.phase]
    hook.before_train_iter(runner, 0)
    phases.append(hook._hb.phase)
    loss = model(torch.ones(2, 4)).sum()
    phases.append(hook._hb.phase)
    model(torch.ones(2, 4))  # a second forward (another hook's) marks only
    phases.append(hook._hb.phase)
    wrapper.update_params(loss)
    phases.append(hook._hb.phase)
    hook.after_train_iter(runner, 0)
    phases.append(hook._hb.phase)
    assert phases == ['data', 'data preprocessing', 'backward', 'backward',
                      'hooks (after_train_iter)', 'data']
    hook.after_train(runner)
    hook.after_run(runner)
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not wrapper.optimizer._optimizer_step_pre_hooks
    assert not wrapper.optimizer._optimizer_step_post_hooks
    assert hook._thread is None


def test_collective_is_named_from_the_stack():
    """The outermost torch.distributed.distributed_c10d frame names the
    collective; a stack without one names none."""
    import sys

    from mmsafe.engine.hooks.hang_watchdog_hook import collective_of
    c10d = 'site-packages/torch/distributed/distributed_c10d.py'
    namespace = dict(sys=sys)
    exec(compile('def all_gather(cb):\n    return cb()\n'
                 'def all_gather_object(cb):\n    return all_gather(cb)\n',
                 c10d, 'exec'), namespace)
    frame = namespace['all_gather_object'](lambda: sys._getframe())
    assert collective_of(frame) == 'all_gather_object'
    assert collective_of(sys._getframe()) is None

"""The pieces of a stop and a resume, in one process: random state saved
weights-only and restored, what makes a resume inexact, loader workers
that outlive a job-wide stop signal, and processes forked from the
training process that still end on their parent's ``terminate()``."""
import multiprocessing
import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

from mmsafe.datasets.loader.processes import IgnoreStopSignals
from mmsafe.engine.monitor_sync import MonitorSync
from mmsafe.engine.resume_state import differences
from mmsafe.rng import RNGState


def _draws():
    return (random.random(), float(np.random.rand()),
            float(torch.rand(())))


def test_random_state_survives_a_weights_only_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draws()
    path = str(tmp_path / 'state.pth')
    torch.save(dict(rng=RNGState().state_dict()), path)
    expected = [_draws() for _ in range(3)]
    _draws()  # move on
    RNGState.from_state_dict(
        torch.load(path, weights_only=True)['rng']).restore()
    assert [_draws() for _ in range(3)] == expected
    if torch.cuda.is_available():
        # MMEngine's resume loads the checkpoint onto the training device
        RNGState.from_state_dict(torch.load(
            path, weights_only=True, map_location='cuda')['rng']).restore()
        assert [_draws() for _ in range(3)] == expected


def test_differences_name_what_makes_a_resume_inexact():
    saved = dict(world_size=2, dataset_length=300, seed=0,
                 config={'optim_wrapper.optimizer.lr': '0.002',
                         'train_dataloader.batch_size': '4'})
    same = differences(saved, dict(saved))
    assert same == []
    changed = differences(saved, dict(
        world_size=1, dataset_length=290, seed=0,
        config={'optim_wrapper.optimizer.lr': '0.002',
                'train_dataloader.batch_size': '8'}))
    assert changed[0].startswith('world size 2 -> 1')
    assert changed[1].startswith('train dataset length 300 -> 290')
    assert changed[2] == 'config train_dataloader.batch_size: 4 -> 8'
    assert len(changed) == 3


def _sleep_as_worker(ready):
    IgnoreStopSignals()(0)
    ready.set()
    time.sleep(60)


@pytest.mark.skipif(not hasattr(signal, 'sigwaitinfo'),
                    reason='sigwaitinfo (Linux) tells who sent SIGTERM')
def test_loader_worker_outlives_job_wide_signals_not_its_parents_terminate():
    ctx = multiprocessing.get_context('fork')
    ready = ctx.Event()
    worker = ctx.Process(target=_sleep_as_worker, args=(ready, ),
                         daemon=True)
    worker.start()
    try:
        assert ready.wait(20)
        # What a cluster or a console sends to every process of the job:
        for sig in ('USR1', 'INT', 'TERM'):
            subprocess.run(['kill', f'-{sig}', str(worker.pid)], check=True)
        worker.join(1.0)
        assert worker.is_alive()
        worker.terminate()  # the training process ends its worker
        worker.join(10)
        assert not worker.is_alive()
        assert worker.exitcode == -signal.SIGTERM
    finally:
        if worker.is_alive():
            worker.kill()


class _Runner:
    from mmengine.logging import MessageHub
    monitor_sync = MonitorSync()
    rank_channel = None
    message_hub = MessageHub.get_instance('preemption-units')


def _sleep():
    time.sleep(60)


def test_a_forked_child_ends_on_terminate_while_the_hook_handles_signals():
    # A metric's multiprocessing pool forks from the training process while
    # PreemptionHook's handlers are installed; pool.terminate() must still
    # end its workers (else the evaluation waits for them forever).
    from mmsafe.engine.hooks import PreemptionHook
    hook = PreemptionHook()
    hook.before_run(_Runner())
    try:
        child = multiprocessing.get_context('fork').Process(target=_sleep,
                                                            daemon=True)
        child.start()
        time.sleep(0.3)
        child.terminate()
        child.join(10)
        alive = child.is_alive()
        if alive:
            child.kill()
        assert not alive
        assert child.exitcode == -signal.SIGTERM
        # In the training process itself the signal only asks for a stop.
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert [name for name, _, _ in hook._received] == ['SIGTERM']
    finally:
        hook.after_run(None)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_functions_address_is_not_a_config_difference():
    from mmengine.config import Config

    from mmsafe.engine.resume_state import training_config

    def collate(batch):
        return batch
    first = training_config(Config(dict(
        train_dataloader=dict(collate_fn=dict(type=collate)),
        work_dir='a')))
    second = training_config(Config(dict(
        train_dataloader=dict(collate_fn=dict(type=collate)),
        work_dir='b')))
    assert ' at 0x' not in first['train_dataloader.collate_fn.type']
    assert first == second  # work_dir does not count either


def test_a_new_stop_checkpoint_replaces_the_earlier_ones(tmp_path):
    from mmsafe.engine.hooks.preemption_hook import \
        _remove_older_stop_checkpoints
    for name in ('preempted_iter_5.pth', 'preempted_iter_9.pth',
                 'epoch_1.pth'):
        (tmp_path / name).write_bytes(b'x')
    _remove_older_stop_checkpoints(str(tmp_path),
                                   str(tmp_path / 'preempted_iter_9.pth'))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        'epoch_1.pth', 'preempted_iter_9.pth']


def test_a_resume_into_another_loop_is_reported_at_once(tmp_path):
    # A custom train loop cannot replay: the resume says so when it is
    # made, instead of never.
    from mmengine.logging import MessageHub

    from mmsafe.engine.resume_state import STATE_KEY, plan_resume

    class Loop:
        dataloader = None

    class Runner:
        train_loop = Loop()
        work_dir = str(tmp_path)
        message_hub = MessageHub.get_instance('preemption-units-loop')

    meta = dict(epoch=1, iter=30, **{STATE_KEY: None})
    plan = plan_resume(Runner(), dict(meta=meta), 'x.pth')
    assert plan.done and not plan.exact
    info = MessageHub.get_current_instance().get_info(
        'mmsafe/resume_continuation')
    assert info['checkpoint'] == 'x.pth' and info['exact'] is False

"""DivergenceRollbackHook through tools/train.py with a real Runner.

Toys (tests/engine/step_toys.py): a forced divergence, the learning rate
x1000 for one iteration (``LrSpikeHook``), wrecks the weights; the next
steps spike and are skipped until the skip rule rolls the run back. Single
process and 2-rank gloo DDP; a fault that stays exhausts the rollbacks and
stops the run with what was tried. The demo detector: the same forced
divergence is rolled back and the run ends with mAP50 >= 0.5.
"""
import json
import os.path as osp

import pytest
import torch

from mmsafe.events import read_events
from tests.engine import spike_runs
from tests.engine import step_toys_runs as runs
from tests.utils import run_once_per_session, run_train

ITERS = 30
SNAPSHOT = 5
SPIKE_AT = 12  # the iteration (0-based) trained with lr x1000
ROLLBACK = ("dict(type='DivergenceRollbackHook', snapshot_interval=5, "
            'skip_window=10, max_skips=2, loss_ratio=None{extra})')
WRAPPER = runs.sgd_wrapper(spike_skip=dict(window=8))


def single(name, hooks):
    """A single-process toy run, once per session."""
    def run(tmp):
        work_dir = osp.join(tmp, name)
        cfg = runs.make_config(work_dir, [], ITERS, WRAPPER, hooks=hooks)
        return work_dir, run_train(cfg, nproc=1, timeout=runs.TIMEOUT)
    return run_once_per_session(f'rollback_single_{name}', run)


def dump(work_dir, rank=0):
    return torch.load(osp.join(work_dir, f'step_dump_rank{rank}.pt'),
                      weights_only=False)


def check_rolled_back(work_dir, result, nproc):
    assert not result.timed_out, result
    assert result.returncode == 0, result
    assert 'ROLLBACK 1 of at most 3' in result.output
    event, = read_events(work_dir, 'rollback')
    # skipped from SPIKE_AT + 1 on; the third skip in the window rolls
    # back to the last snapshot with a clean interval after it
    assert event['iter'] == SPIKE_AT + 3, event
    good = event['to_iter']
    assert good % SNAPSHOT == 0 and good <= SPIKE_AT - SNAPSHOT + 1
    with open(event['files_list']) as f:
        listed = f.read().split('\n')[:-1]
    moved_past = (event['iter'] + 1 - good) * nproc * runs.BATCH
    assert len(listed) == moved_past
    dumps = [dump(work_dir, r) for r in range(nproc)]
    for d in dumps:
        records = d['records']
        iters = [r['iter'] for r in records]
        # iterations 0..N-1 as planned up to the rollback, whose record (the
        # dump hook runs after the rollback hook) is already the snapshot's
        # last iteration; then training goes on from the snapshot to the end
        at = next(i for i in range(1, len(iters)) if iters[i] < iters[i - 1])
        assert iters[:at] == list(range(event['iter']))
        assert iters[at] == good - 1
        assert iters[at + 1:] == list(range(good, ITERS))
        assert d['last_iter'] == ITERS
        # the restored weights are those at the end of iteration good - 1
        if good:
            assert records[at]['checksum'] == records[good - 1]['checksum']
        assert d['counters']['spike_skips'] >= 3
        for value in d['state_dict'].values():
            assert torch.isfinite(value).all()
    if nproc == 2:
        runs.assert_ranks_identical(work_dir)
        assert [r['iter'] for r in dumps[0]['records']] == \
            [r['iter'] for r in dumps[1]['records']]
    return event


def test_forced_divergence_is_rolled_back_single_process():
    work_dir, result = single('once', (
        f"dict(type='LrSpikeHook', at=[{SPIKE_AT}])",
        ROLLBACK.format(extra=''), "dict(type='SafetyReportHook')"))
    event = check_rolled_back(work_dir, result, nproc=1)
    assert 'rollbacks' in result.output and 'rollback[' in result.output
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        report = json.load(f)
    section = report['summary']['rollbacks']
    assert section['events'] == 1, section
    assert event['cause'].startswith('3 optimizer steps skipped')


def test_forced_divergence_is_rolled_back_on_every_rank_alike():
    work_dir, result = runs.train(
        'rollback_ddp', [], ITERS, WRAPPER,
        hooks=(f"dict(type='LrSpikeHook', at=[{SPIKE_AT}])",
               ROLLBACK.format(extra='')))
    check_rolled_back(work_dir, result, nproc=2)


def test_a_divergence_that_stays_exhausts_the_rollbacks():
    work_dir, result = single('lasting', (
        f"dict(type='LrSpikeHook', at=[{SPIKE_AT}], lasting=True)",
        ROLLBACK.format(extra=', max_rollbacks=1')))
    assert not result.timed_out, result
    assert result.returncode != 0, result
    assert 'ROLLBACK 1 of at most 1' in result.output
    assert 'the run diverged again at Iter(train)' in result.output
    assert '1 rollbacks were tried (max_rollbacks=1): rollback 1 at ' \
        f'Iter(train) {SPIKE_AT + 4}' in result.output
    assert len(read_events(work_dir, 'rollback')) == 1


def test_rollback_needs_a_loop_that_can_go_back():
    def run(tmp):
        work_dir = osp.join(tmp, 'plain_runner')
        cfg = runs.make_config(work_dir, [], 4, WRAPPER,
                               hooks=(ROLLBACK.format(extra=''), ))
        with open(cfg, 'a') as f:
            f.write("runner_type = 'Runner'\n")
        return work_dir, run_train(cfg, nproc=1, timeout=runs.TIMEOUT)
    _, result = run_once_per_session('rollback_plain_runner', run)
    assert result.returncode != 0, result
    assert "cannot. Use runner_type = 'SafeRunner'" in result.output


@pytest.mark.timeout(900)
def test_demo_detector_rolled_back_finishes_with_map50_above_half():
    """The demo detector (its own AdamW, clip 10) with lr x1000 for three
    iterations: the weights are wrecked, the steps after spike and are
    skipped, the run is rolled back and ends with mAP50 >= 0.5."""
    at = [60, 61, 62]
    work_dir, result = spike_runs.train(
        'rollback', [], 'dict(window=32)',
        optim_wrapper="dict(type='NaNSkipOptimWrapper')", max_iters=150,
        hooks=(f"dict(type='LrSpikeHook', at={at})",
               "dict(type='DivergenceRollbackHook', snapshot_interval=20)"))
    assert not result.timed_out, result
    assert result.returncode == 0, result
    events = read_events(work_dir, 'rollback')
    assert len(events) == 1, events
    assert events[0]['to_iter'] <= at[0] and events[0]['iter'] > at[0]
    assert 'ROLLBACK 1 of at most 3' in result.output
    assert spike_runs.map50(result) >= 0.5


def test_a_loss_that_stays_high_is_rolled_back_on_every_rank_alike():
    """No step is skipped (no spike rule, finite gradients): lr x300 for one
    iteration leaves a loss ten times its median; the loss rule, judged on
    the monitoring all-reduce every 4 iterations, rolls every rank back at
    the same iteration."""
    def run(tmp):
        work_dir = osp.join(tmp, 'loss_rule')
        cfg = runs.make_config(work_dir, [], 40, runs.sgd_wrapper(), hooks=(
            "dict(type='LrSpikeHook', at=[15], factor=300.0)",
            "dict(type='DivergenceRollbackHook', snapshot_interval=5, "
            'skip_window=10, max_skips=2, loss_window=10, '
            'loss_patience=3)'))
        with open(cfg) as f:
            text = f.read()
        with open(cfg, 'w') as f:
            f.write(text.replace("dict(type='LoggerHook', interval=1)",
                                 "dict(type='LoggerHook', interval=4)"))
        return work_dir, run_train(cfg, nproc=2, timeout=runs.TIMEOUT)
    work_dir, result = run_once_per_session('rollback_loss_rule', run)
    assert not result.timed_out, result
    assert result.returncode == 0, result
    event, = read_events(work_dir, 'rollback')
    assert event['cause'].startswith('the training loss stayed above 2x '
                                     'its rolling median'), event
    # judged at a sync (every 4 iterations), after the fault at 15
    assert (event['iter'] + 1) % 4 == 0 and event['iter'] > 15
    d0, d1 = runs.assert_ranks_identical(work_dir)
    assert d0['counters']['skipped'] == 0
    assert [r['iter'] for r in d0['records']] == \
        [r['iter'] for r in d1['records']]
    assert d0['last_iter'] == 40
    lines = [ln for ln in result.output.splitlines() if 'ROLLBACK 1' in ln]
    assert len(lines) == 2 and lines[0] == lines[1]  # one per rank


def test_with_accumulation_it_acts_where_a_window_ends():
    """accumulative_counts=2: snapshots and the rollback wait for the end
    of an accumulation window, and the restored run keeps stepping at the
    end of each window."""
    wrapper = runs.sgd_wrapper(accumulative_counts=2)
    hooks = ("dict(type='LrSpikeHook', at=[12, 13], factor=300.0)",
             "dict(type='DivergenceRollbackHook', snapshot_interval=5, "
             'loss_window=6, loss_patience=2)')

    def run(tmp):
        work_dir = osp.join(tmp, 'accumulate')
        cfg = runs.make_config(work_dir, [], ITERS, wrapper, hooks=hooks)
        return work_dir, run_train(cfg, nproc=1, timeout=runs.TIMEOUT)
    work_dir, result = run_once_per_session('rollback_accumulate', run)
    assert not result.timed_out, result
    assert result.returncode == 0, result
    event, = read_events(work_dir, 'rollback')
    assert (event['iter'] + 1) % 2 == 0, event  # a window's last iteration
    assert event['to_iter'] % 2 == 0, event  # snapshot due at 5, taken at 6
    records = dump(work_dir)['records']
    iters = [r['iter'] for r in records]
    at = next(i for i in range(1, len(iters)) if iters[i] < iters[i - 1])
    good = event['to_iter']
    assert iters[at] == good - 1
    assert records[at]['checksum'] == records[good - 1]['checksum']
    # the weights move at the end of each window only, before and after
    sums = [r['checksum'] for r in records[at:]]
    its = iters[at:]
    for i in range(1, len(sums)):
        assert (sums[i] != sums[i - 1]) == (its[i] % 2 == 1), (its[i], sums)
    assert 'Resumed iteration number is not divisible' not in result.output

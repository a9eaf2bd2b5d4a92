"""A fault on one rank is named where the user looks: rank 0's console and
log, the error that stops the run, ``safety_report.json``.

2-rank gloo runs of ``tools/train.py`` (the toy paired task, real Runner)
with a fault injected on rank 1 only, each with a hard timeout:

* ``loss_macl`` vanishes from rank 1's loss dict at iteration 13, with
  ``find_unused_parameters`` False (DDP then fails one iteration later with
  its unused-parameter error) and True (DDP trains on, silently);
* the infrared encoder is left out on rank 1 (the loss keys unchanged);
* rank 1's data pipeline raises, ranks started without torchrun's agent
  (as ``srun`` starts them): once while rank 0 waits in a collective, once
  while rank 0 is busy outside any collective, and once with a failed rank
  whose shutdown hangs.
"""
import glob
import json
import os.path as osp
import re
import tempfile

import pytest

from tests.engine.check_toys_cfg import toy_config
from tests.engine.check_toys_run import events, why
from tests.utils import run_ranks_without_agent, run_train

HOOKS = "[dict(type='MACLCheckHook'), dict(type='SafetyReportHook')]"
RUNNER = "runner_type = 'SafeRunner'\n"


def _config(tmp, name, model='', fup=False, dataset='', max_iters=30,
            extra=''):
    extra = (RUNNER + 'model_wrapper_cfg = dict(type='
             f"'MMDistributedDataParallel', find_unused_parameters={fup})\n"
             + extra)
    path = toy_config(tmp, name, HOOKS, model=model, max_iters=max_iters,
                      optim_extra=", type='NaNSkipOptimWrapper'",
                      extra=extra)
    if dataset:
        with open(path) as f:
            text = f.read()
        text = text.replace("pairing='aligned')",
                            f"pairing='aligned', {dataset})", 1)
        with open(path, 'w') as f:
            f.write(text)
    return path, osp.join(tmp, name)


def _rank0_log(work_dir):
    """Rank 0's log file (MMEngine writes no file for the other ranks)."""
    files = glob.glob(osp.join(work_dir, '*', '*.log'))
    assert len(files) == 1, files
    with open(files[0], encoding='utf-8') as f:
        return f.read()


def _report(work_dir, name='safety_report.json'):
    with open(osp.join(work_dir, name), encoding='utf-8') as f:
        return json.load(f)


VANISH = "macl_fault='vanish', macl_fault_at=12, macl_fault_rank=1"


@pytest.mark.timeout(600)
def test_vanished_loss_term_explains_ddp_unused_parameter_error():
    tmp = tempfile.mkdtemp()
    cfg, work_dir = _config(tmp, 'vanish', model=VANISH, fup=False)
    result = run_train(cfg, nproc=2, timeout=300)
    assert not result.timed_out and result.returncode != 0, why(result)
    out = result.output
    # PyTorch's error is still there, as the cause of mmsafe's.
    assert 'Expected to have finished reduction' in out, why(result)
    # The error that stops the run: rank, iteration, loss terms compared
    # with earlier iterations and the other rank, the module, the fix.
    explained = re.search(r'DDPParameterError: \[mmsafe\] DDP stopped: on '
                          r'rank 1, in iteration 13, the parameters of '
                          r'macl_head \(13 parameters\) got no gradient', out)
    assert explained, why(result)
    assert 'Loss terms of rank 1 in iteration 13: loss_cls.' in out
    assert 'compared with its iterations 1-12: loss_macl missing.' in out
    assert ('rank 0 (its terms as of iteration 1): has loss_macl, which '
            'rank 1 lacked.') in out
    assert 'What to fix: Every rank must return every loss term' in out
    assert 'TORCH_DISTRIBUTED_DEBUG' not in out.split(
        'DDPParameterError: [mmsafe]')[1].split("PyTorch's message")[0]
    # Rank 0's log (and console): the finding of rank 1 as it happened,
    # then rank 1's failure; rank 0 itself stops naming rank 1.
    log = _rank0_log(work_dir)
    assert ('[mmsafe] [from rank 1] rank 1, iteration 13: loss term '
            'loss_macl missing from the loss dict') in log, log[-4000:]
    assert ('[mmsafe] rank 1 failed in iteration 13: DDPParameterError'
            in log), log[-4000:]
    assert 'PeerRankFailedError: [mmsafe] rank 1 failed in iteration 13, ' \
        'so rank 0 could not go on' in out, why(result)
    # The run stopped at the fault, before the next log interval.
    assert 'Iter(train) [15/30]' not in out
    report = _report(work_dir)
    root = report['root_cause']
    assert (root['rank'], root['iter'], root['cause']) == (
        1, 13, 'ddp_unused_parameters'), root
    assert root['missing'] == ['loss_macl']
    assert root['modules'] == ['macl_head (13 parameters)']
    assert root['other_ranks']['0']['keys'] == ['loss_cls', 'loss_macl']
    assert report['summary']['rank_faults']['events'] >= 1
    faults = events(work_dir, 'rank_fault_loss_terms')
    assert [(e['rank'], e['iter'], e['missing']) for e in faults] == [
        (1, 13, ['loss_macl'])], faults


@pytest.mark.timeout(600)
def test_vanished_loss_term_is_reported_with_find_unused_parameters():
    tmp = tempfile.mkdtemp()
    cfg, work_dir = _config(tmp, 'vanish_fup', model=VANISH, fup=True,
                            max_iters=20)
    result = run_train(cfg, nproc=2, timeout=300)
    assert not result.timed_out and result.returncode == 0, why(result)
    log = _rank0_log(work_dir)
    finding = log.find('[mmsafe] [from rank 1] rank 1, iteration 13: loss '
                       'term loss_macl missing from the loss dict (present '
                       "in this rank's iterations 1-12). The loss no longer "
                       'reaches: macl_head (13 parameters).')
    assert finding >= 0, log[-4000:]
    # Within the iteration: before rank 0 logs iteration 15 (the next log
    # interval, where the monitoring sync would tell).
    assert finding < log.find('Iter(train) [15/20]'), log[-4000:]
    # The MACL check's verdict names the rank where it happened.
    assert ('MACLCheckHook at iteration 15 (on rank(s) 1 of 2; reported by '
            'rank 0): loss_macl is missing') in log
    report = _report(work_dir)
    assert report['status'] == 'finished'
    section = report['summary']['rank_faults']
    assert section['events'] == 1, section
    assert section['counters']['rank_faults']['1']['faulty_iters'] == 8
    assert section['counters']['rank_faults']['0']['faulty_iters'] == 0


@pytest.mark.timeout(600)
def test_skipped_branch_names_its_module_from_ddp_indices():
    tmp = tempfile.mkdtemp()
    cfg, work_dir = _config(tmp, 'skip_ir',
                            model='skip_ir_rank=1, skip_ir_at=7')
    result = run_train(cfg, nproc=2, timeout=300)
    assert not result.timed_out and result.returncode != 0, why(result)
    out = result.output
    assert ('DDP stopped: on rank 1, in iteration 8, the parameters of '
            'ir_enc (2 parameters) got no gradient') in out, why(result)
    assert 'compared with its iterations 1-7: the same terms.' in out
    assert 'rank 0 (its terms as of iteration 1): the same terms.' in out
    # The names, from DDP's parameter indices (the index order itself is
    # checked against DDP's reducer in test_rank_fault_analysis.py).
    root = _report(work_dir)['root_cause']
    assert root['parameters'] == ['ir_enc.0.weight', 'ir_enc.0.bias']
    assert root['modules'] == ['ir_enc (2 parameters)']


@pytest.mark.timeout(600)
def test_module_unused_on_every_rank_is_named_at_the_first_iteration():
    tmp = tempfile.mkdtemp()
    cfg, work_dir = _config(tmp, 'spare', model='spare=True')
    result = run_train(cfg, nproc=2, timeout=300)
    assert not result.timed_out and result.returncode != 0, why(result)
    out = result.output
    assert re.search(r'DDP stopped: on rank [01], in iteration 1, the '
                     r'parameters of spare \(2 parameters\) got no '
                     'gradient', out), why(result)
    assert 'In the first iteration this usually means modules that no ' \
        'loss uses at all' in out


FAIL = 'fail_rank=1, fail_after=80'


def _assert_rank1_error_named_on_rank0(rank0, work_dir):
    assert ('[mmsafe] rank 1 failed in iteration 11: ValueError' in
            rank0.output), rank0.output[-6000:]
    assert 'toy transform failed on sample' in rank0.output
    root = _report(work_dir)['root_cause']
    assert (root['rank'], root['iter'], root['type']) == (1, 11, 'ValueError')
    assert 'toy transform failed on sample' in root['message']


@pytest.mark.timeout(300)
def test_data_pipeline_error_without_agent_is_named_on_rank0():
    tmp = tempfile.mkdtemp()
    cfg, work_dir = _config(tmp, 'data_error', dataset=FAIL)
    rank0, rank1 = run_ranks_without_agent(cfg, 2, timeout=200)
    assert not rank0.timed_out and not rank1.timed_out
    assert rank0.returncode != 0 and rank1.returncode != 0
    assert 'ValueError: toy transform failed on sample' in rank1.output
    _assert_rank1_error_named_on_rank0(rank0, work_dir)
    assert ('PeerRankFailedError: [mmsafe] rank 1 failed in iteration 11, '
            'so rank 0 could not go on') in rank0.output


@pytest.mark.timeout(300)
def test_rank_busy_outside_collectives_stops_within_grace():
    # Rank 0 reads a slow sample (600 s, outside any collective) when rank
    # 1 fails: without mmsafe it would learn of it only then, long after
    # this test's limit.
    tmp = tempfile.mkdtemp()
    cfg, work_dir = _config(
        tmp, 'busy', dataset=FAIL + ', sleep_rank=0, sleep_after=80, '
        'sleep_s=600', extra='mmsafe_peer_grace = 3\n')
    rank0, rank1 = run_ranks_without_agent(cfg, 2, timeout=200)
    assert not rank0.timed_out, rank0.output[-4000:]
    assert rank0.returncode == 1, rank0.output[-4000:]
    assert ('rank 0 ends its process (exit code 1): rank 1 failed 3 s ago'
            in rank0.output), rank0.output[-4000:]
    _assert_rank1_error_named_on_rank0(rank0, work_dir)


@pytest.mark.timeout(300)
def test_failed_rank_whose_shutdown_hangs_ends_within_grace():
    tmp = tempfile.mkdtemp()
    cfg, work_dir = _config(tmp, 'linger', dataset=FAIL + ', linger_s=120',
                            extra='mmsafe_peer_grace = 3\n')
    rank0, rank1 = run_ranks_without_agent(cfg, 2, timeout=100)
    assert not rank0.timed_out and not rank1.timed_out, (
        rank0.output[-3000:], rank1.output[-3000:])
    assert rank1.returncode == 1
    assert 'still alive 3 s after its error' in rank1.output
    _assert_rank1_error_named_on_rank0(rank0, work_dir)

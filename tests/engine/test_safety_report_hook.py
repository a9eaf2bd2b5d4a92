"""SafetyReportHook on real runs through tools/train.py with the safety
fragment (SafeRunner): a finished run, a resumed one, a 2-rank gloo run and
crashing runs; under the stock Runner a crash writes no report. In
process: ``sections`` names guards by their registered type names."""
import json
import os.path as osp
from types import SimpleNamespace

import pytest
from mmengine.logging import MessageHub

from mmsafe.engine.hooks import SafetyReportHook
from mmsafe.engine.hooks.safety_report_hook import SafetyReport
from mmsafe.events import update_counters, write_event
from mmsafe.guard_outputs import CounterKey, Event, UnknownGuardError
from tests.engine.ckpt_toys_cfg import TOY_CONFIG, latest_log
from tests.utils import REPO_ROOT, run_train, write_config

HOOKS = ("[dict(type='FakeGuardHook', skip_iters=(1, 3), "
         "empty_iters_rank1=(2, )), dict(type='SafetyReportHook')]")


# runner_type = 'SafeRunner' (the fragment's custom_hooks are replaced).
SAFETY = '_base_ = [{!r}]\n'.format(
    osp.join(REPO_ROOT, 'configs', '_base_', 'safety_runtime.py'))


def _config(tmp_path, crash_at_iter=None, max_epochs=2, crash_rank=None,
            safety=True):
    text = TOY_CONFIG.format(max_epochs=max_epochs, max_keep=-1,
                             custom_hooks=HOOKS)
    if safety:
        text += SAFETY
    if crash_at_iter is not None:
        text = text.replace(
            "model = dict(type='CkptToyRegressor')",
            f"model = dict(type='CkptToyRegressor', "
            f"crash_at_iter={crash_at_iter}, crash_rank={crash_rank})")
    return write_config(str(tmp_path / 'report.py'), text)


def _report(work_dir, name='safety_report.json'):
    with open(osp.join(work_dir, name)) as f:
        return json.load(f)


def test_report_after_finished_and_resumed_run(tmp_path):
    config = _config(tmp_path)
    work_dir = str(tmp_path / 'work')
    result = run_train(config, timeout=300, args=['--work-dir', work_dir])
    assert result.returncode == 0, result
    report = _report(work_dir)
    assert report['status'] == 'finished' and report['exception'] is None
    assert report['iter'] == 8 and report['epoch'] == 2
    assert report['ranks_reported'] == [0]
    skipped = report['summary']['skipped_steps']
    assert skipped['by_cause'] == {'nan_loss': 1, 'inf_grad': 1}
    assert skipped['iterations'] == 2
    assert skipped['counters']['step_guard'] == {'0': {'skipped': 2}}
    assert report['summary']['empty_batches']['events'] == 0
    assert report['summary']['resumes']['events'] == 0
    assert report['events']['by_kind'] == {'step_skip': 2}
    assert 'Safety report: finished at epoch 2, iteration 8/8' in \
        result.output
    assert 'skipped_steps    : 2 events at 2 iterations' in result.output

    result = run_train(config, timeout=300, args=[
        '--work-dir', work_dir, '--resume', '--cfg-options',
        'train_cfg.max_epochs=3'])
    assert result.returncode == 0, result
    report = _report(work_dir)
    resumes = report['summary']['resumes']
    # the resume, then what it continued (a regular checkpoint of another
    # config: not exact, and why)
    assert resumes['events'] == 2
    assert resumes['last']['kind'] == 'resume_continuation'
    assert resumes['last']['checkpoint'] == osp.join(work_dir, 'epoch_2.pth')
    assert resumes['last']['exact'] is False
    assert 'config train_cfg.max_epochs: 2 -> 3' in \
        resumes['last']['reasons'], resumes['last']
    assert resumes['counters']['resume']['0']['count'] == 1
    assert report['iter'] == 12
    # Events of the first attempt stay in the report of the whole run.
    assert report['summary']['skipped_steps']['events'] == 2


def test_report_gathers_all_ranks(tmp_path):
    config = _config(tmp_path)
    work_dir = str(tmp_path / 'work')
    result = run_train(config, nproc=2, timeout=400,
                       args=['--work-dir', work_dir])
    assert result.returncode == 0, result
    report = _report(work_dir)
    assert report['world_size'] == 2 and report['ranks_reported'] == [0, 1]
    empty = report['summary']['empty_batches']
    assert empty['events'] == 1 and empty['last']['rank'] == 1
    assert empty['counters']['empty_batch'] == {'0': {'empty': 0},
                                                '1': {'empty': 1}}
    # Both ranks log the same collective skip; it counts once per cause.
    skipped = report['summary']['skipped_steps']
    assert skipped['events'] == 4
    assert skipped['by_cause'] == {'nan_loss': 1, 'inf_grad': 1}
    assert 'differs across ranks' in latest_log(work_dir)
    assert not osp.exists(osp.join(work_dir, 'safety_report_rank1.json'))


def test_report_when_training_crashes(tmp_path):
    config = _config(tmp_path, crash_at_iter=5)
    work_dir = str(tmp_path / 'work')
    result = run_train(config, timeout=300, args=['--work-dir', work_dir])
    assert result.returncode != 0, result
    assert 'ValueError: toy crash at iteration 5' in result.output
    report = _report(work_dir)
    assert report['status'] == 'crashed'
    assert report['exception']['type'] == 'ValueError'
    assert report['exception']['message'] == 'toy crash at iteration 5'
    assert any('toy crash' in line
               for line in report['exception']['traceback'])
    assert report['iter'] == 5
    assert report['summary']['skipped_steps']['by_cause'] == {
        'nan_loss': 1, 'inf_grad': 1}
    assert 'Safety report: crashed' in result.output


def test_crash_on_one_rank_writes_that_ranks_report(tmp_path):
    """No collective on the crash path: rank 1 writes its own report; rank
    0 is torn down by the launcher (no report from it, as documented)."""
    config = _config(tmp_path, crash_at_iter=2, crash_rank=1)
    work_dir = str(tmp_path / 'work')
    result = run_train(config, nproc=2, timeout=400,
                       args=['--work-dir', work_dir])
    assert result.returncode != 0 and not result.timed_out, result
    report = _report(work_dir, 'safety_report_rank1.json')
    assert report['status'] == 'crashed'
    assert report['ranks_reported'] == [1]
    assert report['exception']['message'] == 'toy crash at iteration 2'
    # Rank 1's own counters up to the crash (the skip at iteration 1).
    assert report['summary']['skipped_steps']['counters'] == {
        'step_guard': {'1': {'skipped': 1}}}


def test_report_when_resume_fails(tmp_path):
    config = _config(tmp_path)
    work_dir = str(tmp_path / 'work')
    missing = str(tmp_path / 'missing.pth')
    result = run_train(config, timeout=300,
                       args=['--work-dir', work_dir, '--resume', missing])
    assert result.returncode != 0, result
    report = _report(work_dir)
    assert report['status'] == 'crashed'
    assert report['exception']['type'] == 'FileNotFoundError'
    assert missing in report['exception']['message']


def test_no_crash_report_under_stock_runner(tmp_path):
    """Under MMEngine's plain Runner no hook sees the exception: no report,
    the crash itself is unchanged."""
    config = _config(tmp_path, crash_at_iter=5, safety=False)
    work_dir = str(tmp_path / 'work')
    result = run_train(config, timeout=300, args=[
        '--work-dir', work_dir, '--cfg-options', 'runner_type=Runner'])
    assert result.returncode != 0, result
    assert 'ValueError: toy crash at iteration 5' in result.output
    assert not osp.exists(osp.join(work_dir, 'safety_report.json'))
    assert 'Safety report' not in result.output


def _built(hook, work_dir, hub_name):
    """The report ``hook`` builds from the events in ``work_dir`` and the
    counters in a fresh message hub (one rank, no training loop)."""
    hub = MessageHub.get_instance(hub_name)
    runner = SimpleNamespace(work_dir=work_dir, message_hub=hub)
    return hook.report.build(runner, 'finished', None,
                             [SafetyReport.local_state(runner)], 0.)


def test_sections_move_the_optimizer_wrapper_by_its_type_name(tmp_path):
    work_dir = str(tmp_path)
    # created last, so the current hub that update_counters writes to
    hub = MessageHub.get_instance('test_sections_move_the_optimizer')
    write_event(work_dir, Event.STEP_SKIP, iter=1, reasons=['nan_loss'])
    write_event(work_dir, Event.EMPTY_BATCH, iter=2)
    update_counters(CounterKey.STEP_GUARD, skipped=1)
    hook = SafetyReportHook(sections=[('optimizer', ['NaNSkipOptimWrapper'])])
    summary = _built(hook, work_dir, hub.instance_name)['summary']
    assert summary['optimizer']['events'] == 1
    assert summary['optimizer']['by_cause'] == {'nan_loss': 1}
    assert summary['optimizer']['counters'] == {
        'step_guard': {'0': {'skipped': 1}}}
    assert summary['skipped_steps']['events'] == 0
    assert summary['skipped_steps']['counters'] == {}
    # the other guards' outputs stay where they were
    assert summary['empty_batches']['events'] == 1
    assert list(summary)[-2:] == ['optimizer', 'other']
    # without sections, the wrapper's outputs are skipped steps
    summary = _built(SafetyReportHook(), work_dir,
                     hub.instance_name)['summary']
    assert summary['skipped_steps']['events'] == 1
    assert 'optimizer' not in summary


def test_sections_refuse_a_name_that_is_no_registered_guard():
    with pytest.raises(UnknownGuardError) as info:
        SafetyReportHook(sections=[('optimizer', ['NanSkipOptimWrapper'])])
    message = str(info.value)
    assert "'NanSkipOptimWrapper' is not a registered guard with declared " \
        'outputs' in message
    # the names it could have been
    for name in ('NaNSkipOptimWrapper', 'AmpNaNSkipOptimWrapper',
                 'HangWatchdogHook', 'ScalarBandsHook', 'SafeRunner'):
        assert name in message, name


def test_repeated_offenders_are_images_named_in_two_skipped_steps():
    from mmsafe.engine.hooks.safety_report_hook import repeated_offenders
    events = [
        # the culprit comes round each epoch with other batch mates
        dict(kind='step_skip', iter=10, epoch=0, time=1.0, rank=0,
             reasons=['grad_spike'], files=['a.jpg | ir/a.jpg', 'b.jpg']),
        dict(kind='step_skip', iter=85, epoch=1, time=2.0, rank=1,
             reasons=['grad_spike'], files=['c.jpg', 'a.jpg | ir/a.jpg']),
        dict(kind='step_skip', iter=160, epoch=2, time=3.0, rank=0,
             reasons=['nonfinite_loss'], files=['a.jpg | ir/a.jpg']),
        # a rolled-back run meets iteration 85 again: another step
        dict(kind='step_skip', iter=85, epoch=1, time=4.0, rank=0,
             reasons=['grad_spike'], files=['b.jpg']),
        dict(kind='empty_batch', iter=3, files=['c.jpg', 'c.jpg']),
    ]
    found = repeated_offenders(events)
    assert [(o['file'], o['skips']) for o in found] == [
        ('a.jpg | ir/a.jpg', 3), ('b.jpg', 2)]
    assert found[0]['iters'] == [10, 85, 160]
    assert found[0]['epochs'] == [0, 1, 2]
    assert found[0]['reasons'] == ['grad_spike', 'nonfinite_loss']
    assert repeated_offenders(events, min_skips=3) == found[:1]

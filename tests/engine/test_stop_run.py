"""stop_run ends a run where the loop reads its flag and says why: in the
log, and in the safety report's ``stopped`` (a run a hook stopped is
otherwise a finished run)."""
import json
import os
import os.path as osp

import pytest

from tests.engine.check_toys_cfg import toy_config
from tests.utils import REPO_ROOT, run_train

pytestmark = pytest.mark.slow

STOPPING_HOOK = '''
from mmengine.hooks import Hook
from mmdet.registry import HOOKS
from mmsafe.engine.runner.stop import stop_run


@HOOKS.register_module()
class StopAtThreeHook(Hook):
    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        if runner.iter + 1 == 3:
            stop_run(runner, 'the infrared mean drifted three times')
'''


@pytest.mark.timeout(300)
@pytest.mark.parametrize('runner_type', ['Runner', 'SafeRunner'])
def test_stop_in_an_iteration_loop_is_logged_and_reported(tmp_path,
                                                          runner_type):
    plugin = tmp_path / 'plugin'
    plugin.mkdir()
    (plugin / 'stop_at_three_hook.py').write_text(STOPPING_HOOK)
    cfg = toy_config(
        str(tmp_path), 'run',
        "[dict(type='StopAtThreeHook'), dict(type='SafetyReportHook')]",
        max_iters=10, extra=(
            "custom_imports = dict(imports=['mmsafe', "
            "'tests.engine.check_toys', 'stop_at_three_hook'], "
            'allow_failed_imports=False)\n'
            f'runner_type = {runner_type!r}\n'))
    result = run_train(cfg, timeout=200, env=dict(
        PYTHONPATH=os.pathsep.join([str(plugin), REPO_ROOT])))
    assert result.returncode == 0, result.output[-6000:]
    assert ('training stops after iteration 3: the infrared mean drifted '
            'three times') in result.output, result.output[-6000:]
    with open(osp.join(tmp_path, 'run', 'safety_report.json')) as f:
        report = json.load(f)
    assert report['status'] == 'finished' and report['iter'] == 3, report
    assert report['stopped'] == dict(
        reason='the infrared mean drifted three times', iter=3,
        checkpoint=None), report
    assert not any('stop' in per_rank.get('0', {}) or guard == 'stop'
                   for guard, per_rank in report['counters'].items())
    assert 'stopped by a hook: after iteration 3' in result.output


@pytest.mark.timeout(300)
def test_a_run_no_hook_stopped_reports_no_stop(tmp_path):
    cfg = toy_config(str(tmp_path), 'run', "[dict(type='SafetyReportHook')]",
                     max_iters=4)
    result = run_train(cfg, timeout=200)
    assert result.returncode == 0, result.output[-6000:]
    with open(osp.join(tmp_path, 'run', 'safety_report.json')) as f:
        report = json.load(f)
    assert report['iter'] == 4 and report['stopped'] is None, report
    assert 'stop' not in report['counters'], report['counters']
    assert 'training stops after' not in result.output

"""A plugin's hook talks to mmsafe as mmsafe's own hooks do: it declares
its outputs on its class (``guard_outputs``, nothing else), which then
land in its own section of safety_report.json, and SafeRunner calls its
``explain_failure`` and ``report_crash`` when the run fails (no hook class
is named by the runner).
A toy run through tools/train.py with the safety fragment crashes at
iteration 3."""
import json
import os.path as osp

from tests.engine.ckpt_toys_cfg import TOY_CONFIG
from tests.utils import REPO_ROOT, run_train, write_config

SAFETY = '_base_ = [{!r}]\n'.format(
    osp.join(REPO_ROOT, 'configs', '_base_', 'safety_runtime.py'))


def test_a_plugin_hook_reports_and_explains_a_failure(tmp_path):
    text = TOY_CONFIG.format(
        max_epochs=2, max_keep=-1,
        custom_hooks="[dict(type='PluginReportHook'), "
        "dict(type='SafetyReportHook')]") + SAFETY
    text = text.replace(
        "imports=['mmsafe', 'tests.engine.ckpt_toys']",
        "imports=['mmsafe', 'tests.engine.ckpt_toys', "
        "'tests.engine.handle_toys']").replace(
            "model = dict(type='CkptToyRegressor')",
            "model = dict(type='CkptToyRegressor', crash_at_iter=3)")
    config = write_config(str(tmp_path / 'plugin.py'), text)
    work_dir = str(tmp_path / 'work')
    result = run_train(config, timeout=300, args=['--work-dir', work_dir])
    assert result.returncode != 0, result
    with open(osp.join(work_dir, 'plugin_crash.json')) as f:
        handed = json.load(f)
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        report = json.load(f)
    # the plugin's explanation is the error raised, with PyTorch-side
    # error as its cause, and the root cause of the report
    assert handed['message'] == 'explained by the plugin: toy crash at ' \
        'iteration 3', handed
    assert handed['root_cause']['cause'] == 'plugin_explained', handed
    assert 'explained by the plugin: toy crash at iteration 3' in \
        result.output
    assert report['root_cause']['cause'] == 'plugin_explained', report
    # its outputs land in the section it declared
    plugin = report['summary']['plugin']
    done = report['iter']  # iterations completed before the crash
    assert done >= 2 and plugin['events'] == done, report['summary']
    assert plugin['counters']['plugin'] == {'0': {'seen': done}}, plugin
    assert report['summary']['other']['events'] == 0, report['summary']

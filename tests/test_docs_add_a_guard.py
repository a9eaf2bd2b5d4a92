"""The guard of extending.md's "Add a guard" runs as written: its one file,
imported by ``custom_imports``, trains under MMEngine's plain ``Runner``
and under ``SafeRunner`` with 2 gloo ranks, and writes its event with the
ranks that saw it when the ranks sync (through ``monitor_sync_of(runner)``
and ``write_event``, nothing else of mmsafe's engine)."""
import os
import os.path as osp
import re

import pytest

from mmsafe.events import read_events
from tests.engine.check_toys_cfg import toy_config
from tests.utils import REPO_ROOT, run_train

pytestmark = pytest.mark.slow

MAX_ITERS = 12
LOG_INTERVAL = 5  # toy_config's LoggerHook interval
DOC = osp.join(REPO_ROOT, 'docs', 'advanced_guides', 'extending.md')


def _guard_source() -> str:
    with open(DOC, encoding='utf-8') as f:
        text = f.read()
    section = text.split('## Add a guard', 1)[1]
    blocks = re.findall(r'```python\n(.*?)```', section, re.S)
    assert blocks, 'extending.md: no python block under "Add a guard"'
    assert blocks[0].startswith('# thermal_drift_hook.py\n'), blocks[0][:80]
    return blocks[0]


@pytest.mark.timeout(600)
@pytest.mark.parametrize('runner_type,nproc', [('Runner', 1),
                                               ('SafeRunner', 2)])
def test_the_documented_guard_runs_as_written(tmp_path, runner_type, nproc):
    plugin = tmp_path / 'plugin'
    plugin.mkdir()
    (plugin / 'thermal_drift_hook.py').write_text(_guard_source())
    cfg = toy_config(
        str(tmp_path), 'run', "[dict(type='ThermalDriftHook')]",
        max_iters=MAX_ITERS, extra=(
            "custom_imports = dict(imports=['mmsafe', "
            "'tests.engine.check_toys', 'thermal_drift_hook'], "
            'allow_failed_imports=False)\n'
            f'runner_type = {runner_type!r}\n'))
    result = run_train(cfg, nproc=nproc, timeout=300, env=dict(
        PYTHONPATH=os.pathsep.join([str(plugin), REPO_ROOT])))
    assert result.returncode == 0, result.output[-6000:]
    events = read_events(str(tmp_path / 'run'), 'thermal_drift')
    # The example's check (``...``) is true at every iteration: every rank
    # posts. One process reads its own value at every iteration; under DDP
    # the sum over ranks is read at the log interval (5) and the last
    # iteration, the same on every rank (each rank writes its own record).
    want = (list(range(1, MAX_ITERS + 1)) if nproc == 1 else
            [*range(LOG_INTERVAL, MAX_ITERS + 1, LOG_INTERVAL), MAX_ITERS])
    for rank in range(nproc):
        assert [e['iter'] for e in events if e['rank'] == rank] == want, \
            (rank, events)
    assert all(e['ranks'] == list(range(nproc)) for e in events), events

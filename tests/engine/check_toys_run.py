"""One healthy 2-process run with every check hook on, shared by the four
check-hook test modules (run once per pytest session, also across
pytest-xdist workers), and small readers
for what a run leaves behind."""
import glob
import json
import os.path as osp

from mmsafe.events import read_events
from tests.engine.check_toys_cfg import toy_config
from tests.utils import run_once_per_session, run_train

HEALTHY_HOOKS = """[
    dict(type='MACLCheckHook', chance_warmup=30,
         chance_window=10, control_interval=10, control_warmup=30),
    dict(type='LossDictLintHook'),
    dict(type='EvalCoverageHook'),
    dict(type='ScalarBandsHook', bands=[
        dict(key='loss*', finite=True, action='stop'),
        dict(key='macl_chance_ratio', max=0.95, after_iter=30,
             action='warn', patience=3)]),
]"""

def healthy_run():
    """(work_dir, RunResult) of the shared healthy DDP run."""
    def run(tmp):
        cfg = toy_config(tmp, 'healthy', HEALTHY_HOOKS, max_iters=60,
                         val_interval=30)
        return osp.join(tmp, 'healthy'), run_train(cfg, nproc=2, timeout=600)
    return run_once_per_session('check_toys_healthy', run)


def events(work_dir, kind=None):
    return read_events(work_dir, kind)


def scalars(work_dir):
    """Records of the LocalVisBackend's scalars.json."""
    paths = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    records = []
    for path in paths:
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


def why(result, limit: int = 12000) -> str:
    """Failure text for assertions: the traceback lines first, since the
    launcher's summary pushes them out of RunResult's short repr."""
    lines = result.output.splitlines()
    starts = [i for i, line in enumerate(lines) if 'Traceback' in line]
    head = '\n'.join(lines[starts[0]:starts[0] + 60]) if starts else ''
    return (f'rc={result.returncode} timed_out={result.timed_out}\n'
            f'{head}\n...\n{result.output[-limit:]}')

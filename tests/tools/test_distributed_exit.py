"""A 2-rank gloo run that finished cleanly exits 0 through normal
interpreter teardown, without gloo's abort at exit (see
mmsafe.tools_lib.cli.release_process_group); the log, mmsafe_events.jsonl
and the TensorBoard event file are complete."""
import glob
import json
import os.path as osp

from tests.engine.check_toys_cfg import toy_config
from tests.engine.check_toys_run import why
from tests.utils import run_train

TENSORBOARD = """
vis_backends = [dict(type='LocalVisBackend'),
                dict(type='TensorboardVisBackend')]
visualizer = dict(type='Visualizer', vis_backends=vis_backends)
"""


def test_two_rank_run_exits_0_with_every_file_complete(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import \
        EventFileLoader
    hooks = "[dict(type='LossDictLintHook'), dict(type='SafetyReportHook')]"
    cfg = toy_config(str(tmp_path), 'exit', hooks, max_iters=20,
                     extra=TENSORBOARD)
    work_dir = osp.join(str(tmp_path), 'exit')
    result = run_train(cfg, nproc=2, timeout=400)
    assert result.returncode == 0 and not result.timed_out, why(result)
    assert 'terminate called' not in result.output, why(result)

    # The log file holds what rank 0 printed last: the safety report.
    (log_path, ) = glob.glob(osp.join(work_dir, '*', '*.log'))
    with open(log_path, encoding='utf-8') as f:
        log = f.read()
    assert 'Safety report: finished at' in log, log[-3000:]
    assert log.rstrip().splitlines()[-1] in result.output

    # Every event line is whole JSON; the end-of-run events are there.
    with open(osp.join(work_dir, 'mmsafe_events.jsonl'),
              encoding='utf-8') as f:
        lines = f.read().splitlines()
    events = [json.loads(line) for line in lines]
    assert {(e['kind'], e['rank']) for e in events} >= {
        ('loss_dict_lint', 0), ('loss_dict_lint', 1)}, events
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        json.load(f)

    # TensorBoard: the event file reads to its end and holds the same
    # scalars as scalars.json, up to the last logged iteration.
    (vis_dir, ) = glob.glob(osp.join(work_dir, '*', 'vis_data'))
    with open(osp.join(vis_dir, 'scalars.json')) as f:
        records = [json.loads(line) for line in f if line.strip()]
    train = [r['step'] for r in records if 'loss' in r]
    assert train and train[-1] == 20, records
    (tb_file, ) = glob.glob(osp.join(vis_dir, 'events.out.tfevents.*'))
    tb = {}
    for event in EventFileLoader(tb_file).Load():
        for value in event.summary.value:
            tb.setdefault(value.tag, []).append(event.step)
    assert tb.get('loss') == train, (tb, records)

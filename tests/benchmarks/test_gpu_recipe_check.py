"""The GPU recipe check reads MMEngine's scalars.json as MMEngine writes it
(records of a CUDA run: peak memory as a top-level ``memory`` key)."""
import json
import math

import pytest

from benchmarks.gpu_recipe_check import check_config, parse_args, summarize

# the scripts (launchers, benchmarks), the planner and the docs do not
# depend on the stack: run at one end (tests/conftest.py)
pytestmark = pytest.mark.one_end


def _record(it, macl, memory=None, loss=1.5):
    rec = {'train/lr': 1e-5, 'train/loss': loss, 'train/loss_cls': 0.6,
           'train/loss_macl': macl, 'train/acc': 90.0, 'train/time': 0.1 + it,
           'epoch': 1, 'iter': it, 'step': it}
    if memory is not None:
        rec['memory'] = memory
    return rec


def test_summary_of_a_cuda_run():
    records = [_record(1, 0.14, 2319), _record(2, 0.13, 2617),
               _record(3, 0.12, 2583), _record(4, 0.07, 1645),
               {'val/pascal_voc/mAP': 0.5, 'val/coco/bbox_mAP': 0.2,
                'val/time': 0.1, 'step': 1}]
    summary = summarize([json.loads(json.dumps(r)) for r in records])
    assert summary['memory'] == 2617
    assert summary['iters'] == 4
    assert summary['finite'] is True
    assert summary['loss_macl'] == [0.14, 0.13, 0.12, 0.07]
    assert summary['losses'] == ['loss', 'loss_cls', 'loss_macl']
    assert summary['val'] == {'pascal_voc/mAP': 0.5, 'coco/bbox_mAP': 0.2}
    assert math.isclose(summary['s_per_iter'], 3.6)  # iterations 3-4


def test_summary_of_a_cpu_run_and_a_nan_loss():
    records = [_record(1, 0.1), _record(2, 0.1, loss=float('nan'))]
    summary = summarize(records)
    assert math.isnan(summary['memory'])  # no GPU memory on CPU
    assert summary['finite'] is False


def test_check_config_points_both_loaders_at_the_tree(tmp_path):
    args = parse_args(['--data-dir', str(tmp_path / 'tree'), '--work-dir',
                       str(tmp_path / 'wd'), '--iters', '2'])
    text = open(check_config(args), encoding='utf-8').read()
    assert text.count(str(tmp_path / 'tree') + '/') == 2
    assert 'indices=8' in text and 'init_cfg=None' in text

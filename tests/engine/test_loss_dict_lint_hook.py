"""LossDictLintHook: a double-counted loss, a grad-carrying entry that is
never optimised and a loss weight that never reaches the loss are caught
at the first iteration; a healthy loss dict passes."""
import tempfile

import torch

from mmsafe.engine.analysis.loss_dict import lint_loss_dict
from tests.engine.check_toys_cfg import toy_config
from tests.engine.check_toys_run import events, healthy_run, why
from tests.utils import run_train


def test_healthy_loss_dict_is_clean_on_every_rank():
    work_dir, result = healthy_run()
    assert result.returncode == 0 and not result.timed_out, why(result)
    lint = events(work_dir, 'loss_dict_lint')
    assert {e['rank'] for e in lint} == {0, 1}
    assert all(e['findings'] == [] for e in lint), lint
    assert 'is clean' in result.output


def test_double_counted_loss_raises():
    tmp = tempfile.mkdtemp()
    cfg = toy_config(tmp, 'double', "[dict(type='LossDictLintHook')]",
                     model='double_count=True', max_iters=5)
    result = run_train(cfg, timeout=400)
    assert not result.timed_out, why(result)
    assert result.returncode != 0, why(result)
    assert ("\"loss_total\" is computed from ['loss_cls', 'loss_macl']"
            in result.output), why(result)
    assert 'Iter(train) [5/5]' not in result.output


def test_unused_weight_and_unoptimised_entry_reported():
    tmp = tempfile.mkdtemp()
    cfg = toy_config(
        tmp, 'weights', "[dict(type='LossDictLintHook', policy='warn')]",
        model=("loss_cls=dict(type='ToyUnweightedCELoss', loss_weight=2.0), "
               'grad_log_key=True'), max_iters=5)
    result = run_train(cfg, timeout=400)
    assert result.returncode == 0 and not result.timed_out, why(result)
    (lint, ) = events(f'{tmp}/weights', 'loss_dict_lint')
    findings = '\n'.join(lint['findings'])
    assert len(lint['findings']) == 2, findings
    assert 'loss_cls.loss_weight=2.0 has no effect' in findings
    assert '"macl_similarity" requires grad' in findings
    # MACLHead's weight does reach loss_macl: not reported.
    assert 'macl_head.loss_weight' not in findings
    assert 'found 2 problem(s)' in result.output


def _leaf_losses():
    torch.manual_seed(0)
    w = torch.randn(4, requires_grad=True)
    return w, {'loss_a': (w * 2).sum().abs(), 'loss_b': w.pow(2).mean(),
               'acc': torch.tensor(90.)}


def test_lint_structure_weighted_sum_and_detached_copy():
    w, losses = _leaf_losses()
    assert lint_loss_dict(losses) == []
    weighted = dict(losses, loss_total=0.3 * losses['loss_a'] +
                    2.0 * losses['loss_b'])
    (finding, ) = lint_loss_dict(weighted)
    assert "\"loss_total\" is computed from ['loss_a', 'loss_b']" in finding
    detached = dict(losses, loss_sum=(losses['loss_a'] +
                                      losses['loss_b']).detach())
    (finding, ) = lint_loss_dict(detached)
    assert "\"loss_sum\" = " in finding and "['loss_a', 'loss_b']" in finding
    logged = dict(losses, similarity=w.sum())
    (finding, ) = lint_loss_dict(logged)
    assert '"similarity" requires grad' in finding

"""LossDictLintHook: a double-counted loss, a grad-carrying entry that is
never optimised and a loss weight that never reaches the loss are caught
at the first iteration; a healthy loss dict passes."""
import tempfile
import weakref

import torch

from mmsafe.engine.hooks.loss_dict_lint_hook import lint_loss_dict
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


class _NodeView:
    """A Python object for an autograd node that lives only while referenced,
    like the node objects of some PyTorch versions (and CUDA builds): once
    dropped, the next node's object may be allocated at the same address."""
    _live = weakref.WeakValueDictionary()

    def __init__(self, fn):
        self._fn = fn

    @classmethod
    def of(cls, fn):
        if fn is None:
            return None
        view = cls._live.get(id(fn))
        if view is None:
            view = cls(fn)
            cls._live[id(fn)] = view
        return view

    @property
    def next_functions(self):
        return tuple((_NodeView.of(f), i) for f, i in self._fn.next_functions)


class _ShortLivedNodes(torch.Tensor):
    """A loss tensor whose ``grad_fn`` object is created on each access."""

    @property
    def grad_fn(self):
        return _NodeView.of(torch.Tensor.grad_fn.__get__(self))


def test_lint_does_not_confuse_short_lived_node_objects():
    # independent losses: no finding, however node objects are recycled;
    # a real double count is still found
    x = torch.randn(8, requires_grad=True)
    y = torch.randn(8, requires_grad=True)
    parts = {f'loss_{i}': ((x * (i + 1)).sin() + y.cos() * i).pow(2).mean()
             for i in range(6)}
    independent = {k: v.as_subclass(_ShortLivedNodes) for k, v in parts.items()}
    assert lint_loss_dict(independent, rtol=0, atol=0) == []
    counted_twice = dict(independent, loss_total=independent['loss_0'] +
                         independent['loss_3'])
    findings = lint_loss_dict(counted_twice, rtol=0, atol=0)
    assert findings == [
        "\"loss_total\" is computed from ['loss_0', 'loss_3'], which are "
        'loss entries too: parse_losses sums every key with "loss", so these '
        'terms are counted twice. Return either "loss_total" or its parts, '
        'or rename one side without "loss"'], findings

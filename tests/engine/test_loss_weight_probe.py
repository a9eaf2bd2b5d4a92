"""The loss-weight probe of LossDictLintHook on a model whose box loss is
used only when the batch has positive samples (as MMDetection's heads do:
without positives they return a zero and never call the loss module). A
first batch without positives must not report that weight as "has no
effect"; a weight the called module ignores is still reported."""
import torch
import torch.nn as nn

from mmsafe.engine.hooks.loss_dict_lint_hook import probe_loss_weights


class _Preprocessor(nn.Module):

    def forward(self, data, training=False):
        return data


class _BoxLoss(nn.Module):

    def __init__(self, uses_weight=True):
        super().__init__()
        self.loss_weight = 1.0
        self.uses_weight = uses_weight

    def forward(self, pred):
        loss = pred.abs().mean()
        return self.loss_weight * loss if self.uses_weight else loss


class _Detector(nn.Module):

    def __init__(self, uses_weight=True):
        super().__init__()
        self.data_preprocessor = _Preprocessor()
        self.head = nn.Linear(4, 4)
        self.loss_bbox = _BoxLoss(uses_weight)

    def forward(self, inputs, positives, mode='loss'):
        out = self.head(inputs)
        losses = dict(loss_cls=out.pow(2).mean())
        # no positive sample: a zero, and the loss module is not called
        losses['loss_bbox'] = (self.loss_bbox(out[positives]) if
                               positives.any() else out.sum() * 0)
        return losses


def _probe(model, positives):
    torch.manual_seed(0)
    batch = dict(inputs=torch.randn(6, 4),
                 positives=torch.tensor(positives, dtype=torch.bool))
    return probe_loss_weights(model, batch, 2.0, 1e-4, 1e-7)


def test_a_weight_unused_by_a_batch_without_positives_is_not_reported():
    assert _probe(_Detector(), [False] * 6) == []


def test_a_weight_that_acts_is_not_reported():
    assert _probe(_Detector(), [True, False] * 3) == []


def test_a_weight_the_loss_module_ignores_is_reported():
    findings = _probe(_Detector(uses_weight=False), [True, False] * 3)
    assert len(findings) == 1 and 'loss_bbox.loss_weight=1.0 has no ' \
        'effect' in findings[0], findings

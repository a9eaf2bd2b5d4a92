"""MACLCheckHook on a project's own loss terms, in process (one rank, so
every iteration syncs): the terms come from the run's declaration
(``mmsafe_modalities``: several keys, a weight already applied), or are
recognised under a RoI head's prefix or in a nested dict; each is still
told missing, constant and at chance level, and the hook says which terms
it judged, or that it judged none (the ranks part is in
tests/test_project_guards.py)."""
import math
import uuid

import torch
import torch.nn as nn
from mmengine.logging import MessageHub

from mmsafe.engine.hooks import MACLCheckHook
from mmsafe.events import read_events
from tests.utils import logged_messages


class _Runner:
    """What the hook reads of a runner."""

    def __init__(self, tmp_path, declared=None):
        self.cfg = dict(mmsafe_modalities=declared) if declared else {}
        self.model = nn.Linear(2, 2)
        self.work_dir = str(tmp_path)
        self.iter = 0
        self.hooks = []
        self.message_hub = MessageHub.get_instance(
            f'macl_terms_{uuid.uuid4().hex}')


def _batch(size=4):
    from mmdet.structures import DetDataSample
    return dict(data_samples=[
        DetDataSample(metainfo=dict(img_path=f'v/{i}.jpg',
                                    lwir_path=f'ir/{i}.jpg'))
        for i in range(size)])


def _train(tmp_path, losses_at, iters, declared=None, **hook_args):
    """Run the hook over ``iters`` iterations; ``losses_at(i)`` is the
    logged loss dict of iteration ``i`` (1-based). Returns the hook, the
    log messages and the runner."""
    runner = _Runner(tmp_path, declared)
    hook = MACLCheckHook(**hook_args)
    with logged_messages() as messages:
        hook.before_run(runner)
        hook.before_train(runner)
        for i in range(iters):
            runner.iter = i
            outputs = {k: v if isinstance(v, dict) else torch.tensor(v)
                       for k, v in losses_at(i + 1).items()}
            hook.after_train_iter(runner, i, _batch(), outputs)
    return hook, list(messages), runner


def _varying(i):
    return 1.0 + 0.01 * math.sin(i)


def test_declared_terms_with_a_weight_are_each_judged(tmp_path):
    """Two declared terms, one under a RoI head's prefix, one in a nested
    dict; the InfoNCE term carries a weight of 0.5 and sits at chance:
    ratio 1 only when the weight is taken out."""
    ln4 = math.log(4)

    def losses(i):
        out = {'loss_cls': _varying(i), 'roi.loss_contrast': 0.5 * ln4 *
               (1 + 0.001 * math.sin(i))}
        if i < 30:  # the alignment term vanishes at iteration 30
            out['aux'] = {'loss_align': _varying(i + 1)}
        return out

    declared = dict(losses=dict(loss_contrast=0.5, loss_align=None))
    hook, messages, runner = _train(tmp_path, losses, 40, declared,
                                    chance_warmup=10, chance_window=5)
    assert hook.terms == ['loss_contrast', 'loss_align']
    text = '\n'.join(messages)
    assert 'demanding loss_contrast, loss_align (config ' \
        'mmsafe_modalities)' in text
    assert 'chance level judged on loss_contrast with weight 0.5 ' \
        '(declared)' in text
    chance = read_events(runner.work_dir, 'macl_chance')
    assert chance and all(abs(e['ratio'] - 1.0) < 0.01 for e in chance)
    assert 'loss_contrast is at chance level' in text
    presence = read_events(runner.work_dir, 'macl_presence')
    assert presence[0]['iter'] == 30 and presence[0]['terms'] == [
        'loss_align'] and presence[0]['problems'] == ['missing'], presence
    assert 'MACLCheckHook at iteration 30: loss_align is missing' in text
    local = read_events(runner.work_dir, 'macl_presence_local')
    assert local[0]['files'][0] == 'v/0.jpg | ir/0.jpg', local
    status = hook.guard_status(runner)
    assert status['status'] == 'active', status


def test_recognised_prefixed_term_is_adopted_and_goes_constant(tmp_path):
    """Nothing declared: ``s0.loss_contrast`` is recognised at the first
    sync and demanded from then on; a value that stops changing is told
    constant; its weight was not declared (assumed 1: partial)."""

    def losses(i):
        value = _varying(i) if i <= 10 else 0.7
        return {'loss_cls': _varying(i), 's0.loss_contrast': value}

    hook, messages, runner = _train(tmp_path, losses, 35,
                                    constant_iters=20)
    text = '\n'.join(messages)
    assert hook.active_terms == ['loss_contrast']
    assert 'recognised loss_contrast in the loss dict' in text
    presence = read_events(runner.work_dir, 'macl_presence')
    assert presence and presence[0]['iter'] == 30, presence
    assert presence[0]['problems'] == ['constant']
    assert 'loss_contrast has not changed for 20 iterations' in text
    status = hook.guard_status(runner)
    assert status['status'] == 'partial', status
    assert 'assumed' in status['detail']


def test_no_term_at_all_says_the_checks_are_off(tmp_path):
    hook, messages, runner = _train(
        tmp_path, lambda i: {'loss_cls': _varying(i)}, 3)
    text = '\n'.join(messages)
    assert text.count('the MACL checks are off') == 1
    assert 'loss_macl, loss_contrast, loss_align' in text
    assert not read_events(runner.work_dir, 'macl_presence')
    status = hook.guard_status(runner)
    assert status['status'] == 'inactive'
    assert 'mmsafe_modalities' in status['detail']

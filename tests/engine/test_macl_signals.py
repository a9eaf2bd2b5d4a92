"""The MACL check's signal helpers on hand-made values (the hook's runs
are in test_macl_check_hook.py)."""
import math

import torch

from mmsafe.engine.hooks.macl_signals import (HeadReach, LossLiveness,
                                              WindowMean, chance_ratio,
                                              describe, find_macl_head)


def test_liveness_flags_missing_nonfinite_zero_and_constant():
    live = LossLiveness(constant_iters=3)
    assert live.problems(None, None) == ['missing']
    assert live.problems(float('nan'), None) == ['nonfinite']
    # Zero is excused when no contrast was possible (no ratio).
    assert live.problems(0.0, None) == []
    assert live.problems(0.0, 1.0) == ['zero']
    assert [live.problems(0.7, 0.9) for _ in range(4)] == [
        [], [], ['constant'], ['constant']]
    assert live.problems(0.6, 0.9) == []


def test_head_reach_sees_a_head_left_behind():
    head, other = torch.zeros(2), torch.zeros(3)
    reach = HeadReach([head], [other])
    assert not reach.unreached()  # first call: nothing to compare
    other.add_(1.0)
    head.add_(1.0)
    assert not reach.unreached()
    other.add_(1.0)
    assert reach.unreached()
    assert not reach.unreached()  # nothing moved at all
    assert not HeadReach([], [other]).unreached()


def test_chance_ratio_window_and_description():
    assert math.isclose(chance_ratio(0.1 * math.log(8), 8, 0.1), 1.0)
    assert chance_ratio(1.0, 1, 0.1) is None
    assert chance_ratio(1.0, 4, 0.0) is None
    window = WindowMean()
    window.add(3.0, 2)
    assert window.take(4) is None
    window.add(1.0, 2)
    assert window.take(4) == (1.0, 4)
    assert window.take(1) is None  # restarted
    text = describe('loss_macl', dict(missing=2, constant=1), 8, 20)
    assert text == ('loss_macl is missing from the loss dict (2 of 8 '
                    'rank-iterations); loss_macl has not changed for 20 '
                    'iterations (a constant or detached fallback) (1 of 8 '
                    'rank-iterations)')


def test_find_macl_head_by_path_or_attribute():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2),
                                torch.nn.Sequential(torch.nn.ReLU()))
    assert find_macl_head(model) is None
    model[1][0].last_num_pairs = 0
    assert find_macl_head(model) is model[1][0]
    assert find_macl_head(model, '0') is model[0]

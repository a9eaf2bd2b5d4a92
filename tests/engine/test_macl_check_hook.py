"""MACLCheckHook: healthy pairs stay silent; broken pairing and a MACL loss
missing on one rank are caught (real Runner, real 2-process gloo DDP)."""
import tempfile
from statistics import mean, stdev

from tests.engine.check_toys_cfg import toy_config
from tests.engine.check_toys_run import events, healthy_run, scalars, why
from tests.utils import run_train

CHANCE_HOOK = """[dict(type='MACLCheckHook', chance_warmup=20,
    chance_window=10, control_interval=10, control_warmup=20)]"""


def test_aligned_pairs_silent_under_ddp():
    work_dir, result = healthy_run()
    assert result.returncode == 0 and not result.timed_out, why(result)
    assert not events(work_dir, 'macl_presence')
    assert not events(work_dir, 'macl_chance')
    controls = events(work_dir, 'macl_control')
    assert {e['rank'] for e in controls} == {0, 1}
    # True pairs beat shuffled ones (gap 0 at chance) by 4 spreads of the
    # gap over the late controls (ranks agree, so one value per iteration).
    late = list({e['iter']: e['gap'] for e in controls
                 if e['iter'] > 30}.values())
    assert len(late) >= 2, controls
    assert mean(late) - 4 * stdev(late) > 0, controls
    ratios = [r['macl_chance_ratio'] for r in scalars(work_dir)
              if 'macl_chance_ratio' in r]
    assert len(ratios) >= 10, 'train/macl_chance_ratio was not logged'
    # Below chance (ratio 1) by 4 spreads of the ratio over its last values.
    assert mean(ratios[-5:]) + 4 * stdev(ratios[-5:]) < 1, ratios
    assert 'is at chance level' not in result.output


def test_shuffled_pairs_at_chance_warn():
    tmp = tempfile.mkdtemp()
    cfg = toy_config(tmp, 'shuffled', CHANCE_HOOK, pairing='shuffled',
                     max_iters=40)
    result = run_train(cfg, timeout=400)
    assert result.returncode == 0 and not result.timed_out, why(result)
    work_dir = f'{tmp}/shuffled'
    chance = events(work_dir, 'macl_chance')
    assert chance and all(e['ratio'] >= 0.95 for e in chance), chance
    assert 'loss_macl is at chance level' in result.output
    assert 'cannot tell true visible/infrared pairs' in result.output
    assert not events(work_dir, 'macl_presence')


def _missing_on_rank1(tmp, name, policy, optim_extra=''):
    hooks = (f"[dict(type='MACLCheckHook', check_iters=5, "
             f"policy={policy!r})]")
    cfg = toy_config(tmp, name, hooks, model='drop_macl_on_rank=1',
                     max_iters=12, optim_extra=optim_extra)
    return run_train(cfg, nproc=2, timeout=400)


def test_missing_on_one_rank_raises_on_every_rank():
    tmp = tempfile.mkdtemp()
    result = _missing_on_rank1(tmp, 'missing_raise', 'raise')
    assert not result.timed_out, result
    assert result.returncode != 0, result
    for rank in (0, 1):
        assert (f'MACLCheckHook at iteration 1 (rank {rank}): loss_macl is '
                'missing' in result.output), result
    presence = events(f'{tmp}/missing_raise', 'macl_presence')
    assert {e['rank'] for e in presence} == {0, 1}
    assert 'Iter(train) [ 5/12]' not in result.output


def test_missing_on_one_rank_warns_on_every_rank_with_step_consensus():
    # NaNSkipOptimWrapper reduces the consensus at its step: the hook's
    # values are then decided one iteration later, still on every rank.
    tmp = tempfile.mkdtemp()
    result = _missing_on_rank1(tmp, 'missing_warn', 'warn',
                               optim_extra=", type='NaNSkipOptimWrapper'")
    assert result.returncode == 0 and not result.timed_out, why(result)
    presence = events(f'{tmp}/missing_warn', 'macl_presence')
    assert {e['rank'] for e in presence} == {0, 1}, presence
    by_rank = {r: sorted(e['iter'] for e in presence if e['rank'] == r)
               for r in (0, 1)}
    assert by_rank[0] == by_rank[1], by_rank
    assert 'loss_macl is missing' in result.output


def test_model_without_macl_head_turns_the_check_off():
    # The hook sits in the shared safety runtime: a model without MACL must
    # train, with one line saying the check is off.
    tmp = tempfile.mkdtemp()
    cfg = toy_config(tmp, 'nomacl', "[dict(type='MACLCheckHook')]",
                     model='macl=False', max_iters=3)
    result = run_train(cfg, timeout=400)
    assert result.returncode == 0 and not result.timed_out, why(result)
    assert 'the MACL checks are off' in result.output
    assert not events(f'{tmp}/nomacl', 'macl_presence')

"""MACLCheckHook: healthy pairs stay silent; broken pairing, a MACL loss
missing on one rank, and a MACL loss that vanishes, goes constant or stops
reaching its head in the middle of a run are caught, naming the iteration
(real Runner, real 2-process gloo DDP)."""
import pytest
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
    hooks = f"[dict(type='MACLCheckHook', policy={policy!r})]"
    cfg = toy_config(tmp, name, hooks, model='drop_macl_on_rank=1',
                     max_iters=12, optim_extra=optim_extra)
    return run_train(cfg, nproc=2, timeout=400)


def test_missing_on_one_rank_raises_on_every_rank():
    tmp = tempfile.mkdtemp()
    result = _missing_on_rank1(tmp, 'missing_raise', 'raise')
    assert not result.timed_out, result
    assert result.returncode != 0, result
    # Rank 1 says so at once; both ranks raise together at the first sync
    # (the toy config's log interval is 5).
    local = events(f'{tmp}/missing_raise', 'macl_presence_local')
    assert [(e['rank'], e['iter'], e['problem']) for e in local] == [
        (1, 1, 'missing')]
    for rank in (0, 1):
        assert ('MACLCheckHook at iteration 5 (on rank(s) 1 of 2; reported '
                f'by rank {rank}): loss_macl is missing' in result.output), \
            result
    presence = events(f'{tmp}/missing_raise', 'macl_presence')
    assert {e['rank'] for e in presence} == {0, 1}
    assert 'Iter(train) [ 5/12]' not in result.output


def test_missing_on_one_rank_warns_on_every_rank_with_nan_skip_wrapper():
    # The optim wrapper adds no collective: the hook's values are decided
    # at the log interval, on every rank alike.
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


@pytest.mark.parametrize('fault,problem', [
    ('vanish', 'is missing from the loss dict'),
    ('constant', 'has not changed for 20 iterations'),
    ('detach', 'no longer reaches the MACL head'),
])
def test_macl_fault_in_the_middle_of_a_run_is_reported(fault, problem):
    """The loss is fine for 30 iterations, then breaks: reported at the
    iteration it happens (single process: every iteration syncs), the
    default policy warns and training goes on."""
    tmp = tempfile.mkdtemp()
    cfg = toy_config(tmp, fault, "[dict(type='MACLCheckHook')]",
                     model=f'macl_fault={fault!r}, macl_fault_at=30',
                     max_iters=60)
    result = run_train(cfg, timeout=400)
    assert result.returncode == 0 and not result.timed_out, why(result)
    presence = events(f'{tmp}/{fault}', 'macl_presence')
    assert presence, why(result)
    first = presence[0]['iter']
    # The fault starts at iteration 31. A detached value (constant or not)
    # is seen after the first step that left the head untouched and
    # reported at the next sync; a constant also once it held for 20
    # iterations (50).
    expected = {'vanish': 31, 'constant': 32, 'detach': 32}[fault]
    assert first == expected, presence
    assert f'MACLCheckHook at iteration {first}' in result.output
    assert problem in result.output
    assert 'Iter(train) [60/60]' in result.output  # warned, kept training


def test_raise_policy_stops_at_the_faulty_iteration():
    tmp = tempfile.mkdtemp()
    cfg = toy_config(tmp, 'vanish_raise',
                     "[dict(type='MACLCheckHook', policy='raise')]",
                     model="macl_fault='vanish', macl_fault_at=30",
                     max_iters=60)
    result = run_train(cfg, timeout=400)
    assert result.returncode != 0 and not result.timed_out, why(result)
    assert 'MACLCheckHook at iteration 31' in result.output
    assert "policy='warn' to only log this" in result.output

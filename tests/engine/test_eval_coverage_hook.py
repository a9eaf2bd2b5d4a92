"""EvalCoverageHook: a metric computed on one rank's shard fails on every
rank; identical metrics twice warn; a correct DDP evaluation is counted."""
import tempfile

from tests.engine.check_toys_cfg import toy_config
from tests.engine.check_toys_run import events, healthy_run, why
from tests.utils import run_train


def test_full_coverage_under_ddp_is_silent():
    work_dir, result = healthy_run()
    assert result.returncode == 0 and not result.timed_out, why(result)
    coverage = [e for e in events(work_dir, 'eval_coverage')
                if e['rank'] == 0]
    assert len(coverage) == 2, coverage  # two validations
    for e in coverage:
        # 11 samples on 2 ranks: the sampler pads rank 1 to 6.
        assert e['scored'] == 11 and e['processed'] == [6, 6], e
    assert 'evaluated 11 samples on 2 ranks' in result.output
    assert not events(work_dir, 'eval_coverage_error')
    assert not events(work_dir, 'eval_identical')


def test_metric_on_one_shard_raises_on_every_rank():
    tmp = tempfile.mkdtemp()
    cfg = toy_config(tmp, 'shard', "[dict(type='EvalCoverageHook')]",
                     metric='ShardOnlyAccuracy', max_iters=4,
                     val_interval=4)
    result = run_train(cfg, nproc=2, timeout=400)
    assert not result.timed_out, why(result)
    assert result.returncode != 0, why(result)
    for rank in (0, 1):
        assert (f'(rank {rank}) EvalCoverageHook: ShardOnlyAccuracy scored '
                '6 samples but the val dataset has 11' in result.output), \
            why(result)
    errors = events(f'{tmp}/shard', 'eval_coverage_error')
    assert {e['rank'] for e in errors} == {0, 1}


def test_identical_metrics_warn():
    tmp = tempfile.mkdtemp()
    # lr=0: the model never changes, so both validations score the same.
    cfg = toy_config(tmp, 'frozen', "[dict(type='EvalCoverageHook')]",
                     lr=0.0, max_iters=4, val_interval=2)
    result = run_train(cfg, timeout=400)
    assert result.returncode == 0 and not result.timed_out, why(result)
    identical = events(f'{tmp}/frozen', 'eval_identical')
    assert len(identical) == 1, identical
    assert "metrics equal the previous validation's" in result.output


def test_scored_count_follows_what_evaluate_hands_compute_metrics():
    """MMEngine's evaluate (or an override calling super()) scores every
    rank's results, cut to the dataset size; an evaluate
    that does not gather scores rank 0's own."""
    from mmsafe.engine.hooks.eval_coverage_hook import (gathers_results,
                                                        scored_count)
    from tests.engine.check_toys import ShardOnlyAccuracy, ToyAccuracy

    class LoggedAccuracy(ToyAccuracy):

        def evaluate(self, size):
            return super().evaluate(size)

    assert gathers_results(ToyAccuracy())
    assert gathers_results(LoggedAccuracy())
    assert not gathers_results(ShardOnlyAccuracy())
    assert scored_count(ToyAccuracy(), [6, 6], 11) == 11
    assert scored_count(ToyAccuracy(), [5, 5], 11) == 10
    assert scored_count(ToyAccuracy(), [12], 11) == 11
    assert scored_count(ToyAccuracy(), [4], 11) == 4
    assert scored_count(ShardOnlyAccuracy(), [6, 6], 11) == 6

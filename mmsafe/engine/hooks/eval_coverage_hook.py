"""Check that every validation (and test) scores the whole dataset."""
import logging
import math
from typing import Dict, List, Optional

from mmengine.hooks import Hook

from mmdet.registry import HOOKS

from mmsafe.dist import all_gather_object, get_rank, get_world_size
from mmsafe.events import log, update_counters, write_event

_POLICIES = ('warn', 'raise')


class _MetricCounter:
    """Counts what one metric saw on this rank during one evaluation.

    ``processed`` counts the samples passed to ``process`` (padding of the
    distributed sampler included); ``computed`` is the number of results
    the metric's ``compute_metrics`` received on this rank (None when it
    did not run here: with MMEngine's ``BaseMetric`` it only runs on rank 0,
    after ``collect_results`` gathered every rank's results).
    """

    def __init__(self, metric) -> None:
        self.metric = metric
        self.name = type(metric).__name__
        self.processed = 0
        self.computed: Optional[int] = None
        self.can_compute = hasattr(metric, 'compute_metrics')
        process = metric.process
        # Instance attributes shadow the class methods that ``Evaluator``
        # and ``BaseMetric.evaluate`` call, so nothing else changes.
        metric.process = self._wrap_process(process)
        if self.can_compute:
            metric.compute_metrics = self._wrap_compute(
                metric.compute_metrics)

    def _wrap_process(self, process):

        def counted_process(data_batch, data_samples):
            self.processed += len(data_samples)
            return process(data_batch, data_samples)

        return counted_process

    def _wrap_compute(self, compute):

        def counted_compute(results):
            self.computed = (self.computed or 0) + len(results)
            return compute(results)

        return counted_compute

    def reset(self) -> None:
        self.processed = 0
        self.computed = None


@HOOKS.register_module()
class EvalCoverageHook(Hook):
    """Log how many samples each evaluation really scored and fail when it
    was not the whole dataset.

    The fault it catches: a metric (or evaluator) whose ``compute_metrics``
    runs on one rank's shard instead of the results gathered from all
    ranks, so the reported number describes a fraction of the data (in one
    real run, 2083 of 8332 samples, and the metric never moved).

    How it counts: each metric of the loop's evaluator gets its ``process``
    and ``compute_metrics`` wrapped (instance attributes; the classes are not
    touched). ``compute_metrics`` sees the list of results it scores, one
    per sample for MMEngine/MMDetection metrics; the count of rank 0 (whose
    numbers are the ones reported and broadcast) must equal
    ``len(dataset)``. Counts from every rank are gathered in one collective
    after each evaluation, on every rank, so every rank raises together.

    Not detected: a metric that overrides ``evaluate`` and never calls
    ``compute_metrics`` (logged once, only the processed counts are shown),
    and a metric that stores several results per sample (its count differs
    from the dataset size; set ``policy='warn'`` for it).

    It also warns when every metric of a validation equals the previous
    validation's (a frozen model, a fixed subset, or a cached result).

    Args:
        policy (str): ``'raise'`` (default) raises ``RuntimeError`` when the
            scored count differs from the dataset size; ``'warn'`` logs it.
        check_test (bool): Also check the test loop. Defaults to True.
        warn_identical (bool): Warn when all metrics equal the previous
            validation's. Defaults to True.
    """

    priority = 'NORMAL'

    def __init__(self,
                 policy: str = 'raise',
                 check_test: bool = True,
                 warn_identical: bool = True) -> None:
        if policy not in _POLICIES:
            raise ValueError(f'EvalCoverageHook.policy must be one of '
                             f'{_POLICIES}, got {policy!r}')
        self.policy = policy
        self.check_test = check_test
        self.warn_identical = warn_identical
        self._counters: Dict[int, List[_MetricCounter]] = {}
        self._previous: Optional[Dict[str, float]] = None
        self.num_evaluations = 0
        self.num_errors = 0
        self.num_identical = 0
        self._warned_uncountable = set()

    # ------------------------------------------------------------------ #
    def _arm(self, loop) -> None:
        evaluator = getattr(loop, 'evaluator', None)
        metrics = getattr(evaluator, 'metrics', None)
        if metrics is None:
            return
        key = id(evaluator)
        if key not in self._counters:
            self._counters[key] = [_MetricCounter(m) for m in metrics]
        for counter in self._counters[key]:
            counter.reset()

    def before_val_epoch(self, runner) -> None:
        self._arm(runner.val_loop)

    def before_test_epoch(self, runner) -> None:
        if self.check_test:
            self._arm(runner.test_loop)

    def after_val_epoch(self, runner,
                        metrics: Optional[Dict[str, float]] = None) -> None:
        self._check(runner, runner.val_loop, 'val')
        if self.warn_identical:
            self._check_identical(runner, metrics)

    def after_test_epoch(self, runner,
                         metrics: Optional[Dict[str, float]] = None) -> None:
        if self.check_test:
            self._check(runner, runner.test_loop, 'test')

    # ------------------------------------------------------------------ #
    def _check(self, runner, loop, stage: str) -> None:
        counters = self._counters.get(id(getattr(loop, 'evaluator', None)))
        if not counters:
            return
        dataset_size = len(loop.dataloader.dataset)
        world_size = get_world_size()
        local = [(c.processed, c.computed) for c in counters]
        # One collective per evaluation, on every rank (no early return
        # above depends on rank-local state).
        gathered = all_gather_object(local)
        self.num_evaluations += 1
        problems = []
        for i, counter in enumerate(counters):
            processed = [g[i][0] for g in gathered]
            computed = [g[i][1] for g in gathered]
            ranks_with_data = sum(1 for p in processed if p > 0)
            scored = computed[0]
            if scored is None:
                if counter.name not in self._warned_uncountable:
                    self._warned_uncountable.add(counter.name)
                    log(f'EvalCoverageHook: {counter.name} did not call '
                        'compute_metrics on rank 0, so the number of samples '
                        f'it scored is unknown (processed per rank: '
                        f'{processed}). Only metrics that score through '
                        'compute_metrics are checked.', logging.WARNING)
                continue
            log(f'{stage}: {counter.name} evaluated {scored} samples on '
                f'{ranks_with_data} ranks (dataset: {dataset_size} samples, '
                f'world size {world_size}, processed per rank: {processed})')
            write_event(runner.work_dir, 'eval_coverage', stage=stage,
                        metric=counter.name, scored=scored,
                        dataset_size=dataset_size, processed=processed,
                        computed=computed, iter=runner.iter)
            if scored != dataset_size:
                problems.append(
                    f'{counter.name} scored {scored} samples but the {stage} '
                    f'dataset has {dataset_size} (processed per rank: '
                    f'{processed}; compute_metrics results per rank: '
                    f'{computed}). The metric was computed on '
                    + ('one rank\'s shard: gather the results of all ranks '
                       'before computing (inherit mmengine BaseMetric and '
                       'keep its evaluate(), which calls collect_results)'
                       if world_size > 1 and scored < dataset_size else
                       'a different number of samples than the dataset '
                       'holds: check that evaluate() drops the sampler\'s '
                       'padding (collect_results(results, size))'))
        update_counters('eval_coverage', evaluations=self.num_evaluations,
                        errors=self.num_errors + len(problems),
                        identical=self.num_identical)
        if problems:
            self.num_errors += len(problems)
            message = 'EvalCoverageHook: ' + ' | '.join(problems)
            write_event(runner.work_dir, 'eval_coverage_error',
                        stage=stage, problems=problems, iter=runner.iter)
            if self.policy == 'raise':
                raise RuntimeError(
                    f'[mmsafe] (rank {get_rank()}) {message}. Set '
                    "EvalCoverageHook's policy='warn' to log instead.")
            log(message, logging.ERROR)

    def _check_identical(self, runner,
                         metrics: Optional[Dict[str, float]]) -> None:
        scalars = {
            k: float(v)
            for k, v in (metrics or {}).items()
            if isinstance(v, (int, float)) or (
                hasattr(v, 'numel') and v.numel() == 1)
        }
        if not scalars:
            return
        previous, self._previous = self._previous, scalars
        if previous is None or set(previous) != set(scalars):
            return
        same = all(
            previous[k] == scalars[k] or (math.isnan(previous[k])
                                          and math.isnan(scalars[k]))
            for k in scalars)
        if not same:
            return
        self.num_identical += 1
        update_counters('eval_coverage', identical=self.num_identical)
        write_event(runner.work_dir, 'eval_identical', metrics=scalars,
                    iter=runner.iter, epoch=runner.epoch)
        log(f'EvalCoverageHook: all {len(scalars)} metrics equal the '
            f'previous validation\'s exactly ({scalars}) at epoch '
            f'{runner.epoch}, iteration {runner.iter}. The model may not be '
            'training (zero LR, frozen or skipped steps), or the evaluation '
            'may score a fixed subset or a cached result.', logging.WARNING)

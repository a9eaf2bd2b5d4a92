"""Check that every validation (and test) scores the whole dataset."""
import logging
import math
from typing import Dict, List, Optional

from mmengine.hooks import Hook

from mmsafe.registry import HOOKS

from mmsafe.dist import all_gather_object, get_rank, get_world_size
from mmsafe.engine.guard_status import ACTIVE, INACTIVE
from mmsafe.engine.utils import train_progress
from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import log, log_once, update_counters, write_event

_POLICIES = ('warn', 'raise')
_GATHER_NAMES = {'super', 'collect_results', 'collect_results_cpu',
                 'collect_results_gpu', 'all_gather', 'all_gather_object',
                 'gather', 'gather_object'}


def gathers_results(metric) -> bool:
    """Whether ``metric.evaluate`` scores the results of every rank: it is
    MMEngine's ``BaseMetric.evaluate`` (``collect_results`` then
    ``compute_metrics`` on rank 0), or an override whose code calls
    ``super()`` or a gather function. Any other ``evaluate`` scores the
    results of the rank it runs on."""
    from mmengine.evaluator import BaseMetric
    evaluate = getattr(type(metric), 'evaluate', None)
    if evaluate is BaseMetric.evaluate:
        return True
    code = getattr(evaluate, '__code__', None)
    return code is not None and bool(set(code.co_names) & _GATHER_NAMES)


def scored_count(metric, held: List[int], dataset_size: int) -> int:
    """How many results ``compute_metrics`` receives on rank 0, from what
    every rank's metric holds before ``evaluate``: MMEngine's
    ``collect_results`` joins the ranks' lists and drops the sampler's
    padding (``[:size]``); a metric that does not gather scores rank 0's
    own list."""
    if not gathers_results(metric):
        return held[0]
    return min(sum(held), dataset_size)


@HOOKS.register_module()
class EvalCoverageHook(Hook):
    """Log how many samples each evaluation really scored and fail when it
    was not the whole dataset.

    The fault it catches: a metric (or evaluator) whose ``compute_metrics``
    runs on one rank's shard instead of the results gathered from all
    ranks, so the reported number describes a fraction of the data while
    the log looks like a full evaluation.

    How it counts, from its hook methods: ``after_val_iter`` and
    ``after_test_iter`` count the samples each rank evaluated (its
    ``outputs``, padding of the distributed sampler included) and read how
    many results each metric holds (``metric.results``, the list that
    MMEngine's ``BaseMetric.process`` fills). ``compute_metrics`` on rank 0
    scores what ``evaluate`` hands it: with ``BaseMetric.evaluate`` (or an
    override that calls ``super()`` or a gather function) the results of
    all ranks, interleaved and cut to the dataset size; with any other
    ``evaluate``, rank 0's own results (see :func:`scored_count`). That
    count (the one behind the reported, broadcast numbers) must equal
    ``len(dataset)``. Counts from every rank are gathered in one collective
    after each evaluation, on every rank, so every rank raises together.

    Not detected: a metric without a ``results`` list (logged once, only
    the processed counts are shown), an overriding ``evaluate`` that
    gathers through a helper of another name (counted as not gathering;
    set ``policy='warn'`` for it), and a metric that stores several results
    per sample (its count differs from the dataset size; ``policy='warn'``).

    It also warns when every metric of a validation equals the previous
    validation's (a frozen model, a fixed subset, or a cached result).

    Args:
        policy (str): ``'raise'`` (default) raises ``RuntimeError`` when the
            scored count differs from the dataset size; ``'warn'`` logs it.
        check_test (bool): Also check the test loop. Defaults to True.
        warn_identical (bool): Warn when all metrics equal the previous
            validation's. Defaults to True.
    """

    guard_outputs = GuardOutputs(
        Section.EVAL_COVERAGE,
        events=(Event.EVAL_COVERAGE, Event.EVAL_COVERAGE_ERROR,
                Event.EVAL_IDENTICAL),
        counters=(CounterKey.EVAL_COVERAGE, ))

    priority = 'NORMAL'

    def __init__(self,
                 policy: str = 'raise',
                 check_test: bool = True,
                 warn_identical: bool = True) -> None:
        if policy not in _POLICIES:
            raise MMSafeValueError(f'EvalCoverageHook.policy must be one of '
                                   f'{_POLICIES}, got {policy!r}')
        self.policy = policy
        self.check_test = check_test
        self.warn_identical = warn_identical
        self._previous: Optional[Dict[str, float]] = None
        # Per evaluation, on this rank: samples evaluated, and results held
        # by each metric of the loop's evaluator after the latest iteration.
        self._processed = 0
        self._held: List[int] = []
        self.num_evaluations = 0
        self.num_errors = 0
        self.num_identical = 0

    def guard_status(self, runner) -> dict:
        """Active once an evaluation was counted in this run."""
        if self.num_evaluations:
            return dict(status=ACTIVE, detail=f'{self.num_evaluations} '
                        f'evaluation(s) counted, {self.num_errors} short')
        return dict(status=INACTIVE, detail='no evaluation ran in this run '
                    '(no val or test loop, or none was due)')

    # ------------------------------------------------------------------ #
    @staticmethod
    def _metrics(loop) -> Optional[list]:
        return getattr(getattr(loop, 'evaluator', None), 'metrics', None)

    def _start(self, loop) -> None:
        self._processed = 0
        self._held = [0] * len(self._metrics(loop) or [])

    def _count(self, loop, outputs) -> None:
        self._processed += len(outputs or [])
        for i, metric in enumerate(self._metrics(loop) or []):
            results = getattr(metric, 'results', None)
            self._held[i] = len(results) if isinstance(results, list) \
                else -1

    def before_val_epoch(self, runner) -> None:
        self._start(runner.val_loop)

    def before_test_epoch(self, runner) -> None:
        self._start(runner.test_loop)

    def after_val_iter(self, runner, batch_idx: int, data_batch=None,
                       outputs=None) -> None:
        self._count(runner.val_loop, outputs)

    def after_test_iter(self, runner, batch_idx: int, data_batch=None,
                        outputs=None) -> None:
        if self.check_test:
            self._count(runner.test_loop, outputs)

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
        metrics = self._metrics(loop)
        if not metrics:
            return
        dataset_size = len(loop.dataloader.dataset)
        world_size = get_world_size()
        # One collective per evaluation, on every rank (no early return
        # above depends on rank-local state).
        gathered = all_gather_object((self._processed, list(self._held)))
        processed = [g[0] for g in gathered]
        ranks_with_data = sum(1 for p in processed if p > 0)
        self.num_evaluations += 1
        problems = []
        for i, metric in enumerate(metrics):
            name = type(metric).__name__
            held = [g[1][i] for g in gathered]
            if min(held) < 0:
                log_once(
                    f'eval_coverage/{name}',
                    f'EvalCoverageHook: {name} keeps no results list (not an '
                    'MMEngine BaseMetric), so the number of samples it '
                    f'scored is unknown (processed per rank: {processed}). '
                    'Only metrics that collect results in metric.results '
                    'are checked.', logging.WARNING)
                continue
            scored = scored_count(metric, held, dataset_size)
            log(f'{stage}: {name} evaluated {scored} samples on '
                f'{ranks_with_data} ranks (dataset: {dataset_size} samples, '
                f'world size {world_size}, processed per rank: {processed})')
            write_event(runner.work_dir, Event.EVAL_COVERAGE, stage=stage,
                        metric=name, scored=scored,
                        dataset_size=dataset_size, processed=processed,
                        held=held, iter=train_progress(runner)[1])
            if scored != dataset_size:
                problems.append(
                    f'{name} scored {scored} samples but the {stage} '
                    f'dataset has {dataset_size} (processed per rank: '
                    f'{processed}; results held per rank: {held}). The '
                    'metric was computed on '
                    + ('one rank\'s shard: gather the results of all ranks '
                       'before computing (inherit mmengine BaseMetric and '
                       'keep its evaluate(), which calls collect_results)'
                       if world_size > 1 and scored < dataset_size else
                       'a different number of samples than the dataset '
                       'holds: check that evaluate() drops the sampler\'s '
                       'padding (collect_results(results, size))'))
        update_counters(CounterKey.EVAL_COVERAGE,
                        evaluations=self.num_evaluations,
                        errors=self.num_errors + len(problems),
                        identical=self.num_identical)
        if problems:
            self.num_errors += len(problems)
            message = 'EvalCoverageHook: ' + ' | '.join(problems)
            write_event(runner.work_dir, Event.EVAL_COVERAGE_ERROR,
                        stage=stage, problems=problems,
                        iter=train_progress(runner)[1])
            if self.policy == 'raise':
                raise MMSafeRuntimeError(
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
        epoch, it, _ = train_progress(runner)
        update_counters(CounterKey.EVAL_COVERAGE, identical=self.num_identical)
        write_event(runner.work_dir, Event.EVAL_IDENTICAL, metrics=scalars,
                    iter=it, epoch=epoch)
        log(f'EvalCoverageHook: all {len(scalars)} metrics equal the '
            f'previous validation\'s exactly ({scalars}) at epoch '
            f'{epoch}, iteration {it}. The model may not be '
            'training (zero LR, frozen or skipped steps), or the evaluation '
            'may score a fixed subset or a cached result.', logging.WARNING)

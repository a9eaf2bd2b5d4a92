"""What every guard of mmsafe leaves behind, declared in one table.

A guard reports through three channels (:mod:`mmsafe.events`):

* **events**: records of ``{work_dir}/mmsafe_events.jsonl``, one per thing
  that happened, with a ``kind`` (:class:`Event`);
* **counters**: one dict per guard in the runner's message hub, under
  ``mmsafe/<key>`` (:class:`Counter`), gathered by ``SafetyReportHook``;
* **scalars**: ``train/*`` values in the message hub (:class:`Scalar`),
  which MMEngine's logger and visualizer backends (TensorBoard, ...) show.

A guard that speaks to rank 0 through the rank channel names its
**finding** (:class:`Finding`), and one that sums a value over ranks names
it in the run's monitor sync (:class:`Sync`).

Every name is spelled once, here: the guards, the optimizer wrappers and
:class:`~mmsafe.engine.hooks.SafetyReportHook` read these constants, and
:func:`mmsafe.events.write_event`, :func:`mmsafe.events.update_counters`,
:func:`mmsafe.events.update_scalar` and
:func:`mmsafe.engine.rank_channel.share_finding` refuse a name that no
entry of :data:`GUARD_OUTPUTS` declares (the monitor sync itself takes any
name; tests/test_guard_outputs.py checks that the guards post declared
ones). The section of ``safety_report.json`` an event or counter lands in
is its guard's ``section``.

A plugin that adds a guard of its own declares its outputs with
:func:`declare_guard`.

This module imports nothing from mmsafe, so every part of mmsafe can import
it.
"""
import fnmatch
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple


class Section:
    """Sections of ``safety_report.json``, in the order the report and its
    log table show them (:data:`SECTION_ORDER`)."""
    RANK_FAULTS = 'rank_faults'
    SKIPPED_STEPS = 'skipped_steps'
    EMPTY_BATCHES = 'empty_batches'
    LOADER_FALLBACKS = 'loader_fallbacks'
    WATCHDOG_EVENTS = 'watchdog_events'
    MACL_CHECK = 'macl_check'
    EVAL_COVERAGE = 'eval_coverage'
    PREEMPTION = 'preemption'
    RESUMES = 'resumes'
    OTHER = 'other'


SECTION_ORDER: Tuple[str, ...] = (
    Section.RANK_FAULTS, Section.SKIPPED_STEPS, Section.EMPTY_BATCHES,
    Section.LOADER_FALLBACKS, Section.WATCHDOG_EVENTS, Section.MACL_CHECK,
    Section.EVAL_COVERAGE, Section.PREEMPTION, Section.RESUMES)


class Event:
    """Kinds of the records of ``mmsafe_events.jsonl``."""
    STEP_SKIP = 'step_skip'
    EMPTY_BATCH = 'empty_batch'
    DATALOADER_PROBE = 'dataloader_probe'
    DATALOADER_FALLBACK = 'dataloader_fallback'
    DATALOADER_LEAK = 'dataloader_leak'
    DATALOADER_MEMORY = 'dataloader_memory'
    HANG = 'hang'
    HANG_ABORT = 'hang_abort'
    MACL_PRESENCE_LOCAL = 'macl_presence_local'
    MACL_PRESENCE = 'macl_presence'
    MACL_CHANCE = 'macl_chance'
    MACL_CONTROL = 'macl_control'
    EVAL_COVERAGE = 'eval_coverage'
    EVAL_COVERAGE_ERROR = 'eval_coverage_error'
    EVAL_IDENTICAL = 'eval_identical'
    RANK_FAULT_LOSS_TERMS = 'rank_fault_loss_terms'
    RANK_FAILED = 'rank_failed'
    PREEMPTED = 'preempted'
    RESUME = 'resume'
    RESUME_SKIPPED_CHECKPOINT = 'resume_skipped_checkpoint'
    RESUME_CONTINUATION = 'resume_continuation'
    FIRST_BATCH_STATS = 'first_batch_stats'
    FIRST_BATCH_FLAG = 'first_batch_flag'
    INSTANCE_RESAMPLE = 'instance_resample'
    LOSS_DICT_LINT = 'loss_dict_lint'
    BAND_VIOLATION = 'band_violation'
    BAND_STOP = 'band_stop'


class Counter:
    """Message hub keys of the guards' counters (``mmsafe/<key>``)."""
    STEP_GUARD = 'step_guard'
    EMPTY_BATCH = 'empty_batch'
    DATALOADER_PROBE = 'dataloader_probe'
    HANG_WATCHDOG = 'hang_watchdog'
    MACL_CHECK = 'macl_check'
    MACL = 'macl'
    EVAL_COVERAGE = 'eval_coverage'
    RANK_FAULTS = 'rank_faults'
    PREEMPTION = 'preemption'
    RESUME = 'resume'
    RESUME_CONTINUATION = 'resume_continuation'
    FIRST_BATCH_STATS = 'first_batch_stats'
    VALID_INSTANCE_RESAMPLE = 'valid_instance_resample'
    LOSS_DICT_LINT = 'loss_dict_lint'
    SCALAR_BANDS = 'scalar_bands'
    PARAM_SCHEDULER = 'param_scheduler'
    PAIRING = 'pairing'


class Scalar:
    """``train/*`` scalars that mmsafe publishes in the message hub."""
    GRAD_NORM = 'train/grad_norm'
    GRAD_NORM_OF_RULE = 'train/grad_norm_{}'  # one per grad-norm rule
    SKIPPED_STEPS = 'train/skipped_steps'
    NAN_SKIPS = 'train/nan_skips'
    CONSECUTIVE_SKIPS = 'train/consecutive_skips'
    AMP_OVERFLOWS = 'train/amp_overflows'
    MACL_CHANCE_RATIO = 'train/macl_chance_ratio'


class Sync:
    """Names the guards post to the run's
    :class:`~mmsafe.engine.monitor_sync.MonitorSync` (summed over ranks at
    the log interval under DDP)."""
    EMPTY_BATCH = Event.EMPTY_BATCH
    MACL_CHECK = 'macl_check/{}'  # one per value MACLCheckHook posts
    RESAMPLED = 'valid_instance_resample/resampled'
    LOSS_DICT_FINDINGS = 'loss_dict_lint/findings'
    BAND_STOP = 'scalar_bands/stop'
    PREEMPTION_REQUEST = 'preemption/request'


class Finding:
    """Kinds of the findings a rank sends to rank 0 over the rank channel
    (:func:`mmsafe.engine.rank_channel.share_finding`)."""
    EMPTY_BATCH = Event.EMPTY_BATCH
    DATALOADER_FALLBACK = Event.DATALOADER_FALLBACK
    LOSS_DICT_LINT = Event.LOSS_DICT_LINT
    RANK_FAULT_LOSS_TERMS = Event.RANK_FAULT_LOSS_TERMS
    MACL_PROBLEM = 'macl_{}'  # one per problem of MACLCheckHook


@dataclass(frozen=True)
class GuardOutputs:
    """The declared outputs of one guard.

    Args:
        guard (str): the component that emits them (a class or module).
        section (str): the ``safety_report.json`` section of its events and
            counters (:class:`Section`).
        events (tuple[str]): kinds of its event records.
        counters (tuple[str]): its message hub counter keys.
        scalars (tuple[str]): its ``train/*`` scalars; ``{}`` stands for a
            part chosen at run time (a config pattern, ...).
        findings (tuple[str]): kinds of its rank-channel findings, with
            ``{}`` as in ``scalars``.
        sync (tuple[str]): the names it posts to the monitor sync, with
            ``{}`` as in ``scalars``.
    """
    guard: str
    section: str
    events: Tuple[str, ...] = ()
    counters: Tuple[str, ...] = ()
    scalars: Tuple[str, ...] = ()
    findings: Tuple[str, ...] = ()
    sync: Tuple[str, ...] = ()


GUARD_OUTPUTS: List[GuardOutputs] = [
    GuardOutputs(
        'NanSkipOptimWrapper', Section.SKIPPED_STEPS,
        events=(Event.STEP_SKIP, ),
        counters=(Counter.STEP_GUARD, ),
        scalars=(Scalar.GRAD_NORM, Scalar.GRAD_NORM_OF_RULE,
                 Scalar.SKIPPED_STEPS, Scalar.NAN_SKIPS,
                 Scalar.CONSECUTIVE_SKIPS, Scalar.AMP_OVERFLOWS)),
    GuardOutputs(
        'EmptyBatchSyncHook', Section.EMPTY_BATCHES,
        events=(Event.EMPTY_BATCH, ),
        counters=(Counter.EMPTY_BATCH, ),
        findings=(Finding.EMPTY_BATCH, ),
        sync=(Sync.EMPTY_BATCH, )),
    GuardOutputs(
        'DataLoaderProbeHook', Section.LOADER_FALLBACKS,
        events=(Event.DATALOADER_PROBE, Event.DATALOADER_FALLBACK,
                Event.DATALOADER_LEAK, Event.DATALOADER_MEMORY),
        counters=(Counter.DATALOADER_PROBE, ),
        findings=(Finding.DATALOADER_FALLBACK, )),
    GuardOutputs(
        'HangWatchdogHook', Section.WATCHDOG_EVENTS,
        events=(Event.HANG, Event.HANG_ABORT),
        counters=(Counter.HANG_WATCHDOG, )),
    GuardOutputs(
        'MACLCheckHook', Section.MACL_CHECK,
        events=(Event.MACL_PRESENCE_LOCAL, Event.MACL_PRESENCE,
                Event.MACL_CHANCE, Event.MACL_CONTROL),
        counters=(Counter.MACL_CHECK, ),
        scalars=(Scalar.MACL_CHANCE_RATIO, ),
        findings=(Finding.MACL_PROBLEM, ),
        sync=(Sync.MACL_CHECK, )),
    GuardOutputs(
        'MACLHead', Section.MACL_CHECK,
        counters=(Counter.MACL, )),
    GuardOutputs(
        'EvalCoverageHook', Section.EVAL_COVERAGE,
        events=(Event.EVAL_COVERAGE, Event.EVAL_COVERAGE_ERROR,
                Event.EVAL_IDENTICAL),
        counters=(Counter.EVAL_COVERAGE, )),
    GuardOutputs(
        'RankFaultHook', Section.RANK_FAULTS,
        events=(Event.RANK_FAULT_LOSS_TERMS, ),
        counters=(Counter.RANK_FAULTS, ),
        findings=(Finding.RANK_FAULT_LOSS_TERMS, )),
    GuardOutputs(
        'SafeRunner', Section.RANK_FAULTS,
        events=(Event.RANK_FAILED, )),
    GuardOutputs(
        'PreemptionHook', Section.PREEMPTION,
        events=(Event.PREEMPTED, ),
        counters=(Counter.PREEMPTION, ),
        sync=(Sync.PREEMPTION_REQUEST, )),
    GuardOutputs(
        'mmsafe.checkpoint.resume', Section.RESUMES,
        events=(Event.RESUME, Event.RESUME_SKIPPED_CHECKPOINT),
        counters=(Counter.RESUME, )),
    GuardOutputs(
        'ResumePlan', Section.RESUMES,
        events=(Event.RESUME_CONTINUATION, ),
        counters=(Counter.RESUME_CONTINUATION, )),
    GuardOutputs(
        'FirstBatchStatsHook', Section.OTHER,
        events=(Event.FIRST_BATCH_STATS, Event.FIRST_BATCH_FLAG),
        counters=(Counter.FIRST_BATCH_STATS, )),
    GuardOutputs(
        'ValidInstanceResampleHook', Section.OTHER,
        events=(Event.INSTANCE_RESAMPLE, ),
        counters=(Counter.VALID_INSTANCE_RESAMPLE, ),
        sync=(Sync.RESAMPLED, )),
    GuardOutputs(
        'LossDictLintHook', Section.OTHER,
        events=(Event.LOSS_DICT_LINT, ),
        counters=(Counter.LOSS_DICT_LINT, ),
        findings=(Finding.LOSS_DICT_LINT, ),
        sync=(Sync.LOSS_DICT_FINDINGS, )),
    GuardOutputs(
        'ScalarBandsHook', Section.OTHER,
        events=(Event.BAND_VIOLATION, Event.BAND_STOP),
        counters=(Counter.SCALAR_BANDS, ),
        sync=(Sync.BAND_STOP, )),
    GuardOutputs(
        'SkipAwareParamSchedulerHook', Section.OTHER,
        counters=(Counter.PARAM_SCHEDULER, )),
    GuardOutputs(
        'mmsafe.datasets.pairing', Section.OTHER,
        counters=(Counter.PAIRING, )),
]


class UndeclaredOutputError(ValueError):
    """A guard emitted an event, counter, scalar or finding that no entry
    of :data:`GUARD_OUTPUTS` declares."""


def declare_guard(outputs: GuardOutputs) -> None:
    """Declare the outputs of a guard that is not part of mmsafe (a plugin's
    hook), so that mmsafe's reporting accepts them and the safety report
    files them under ``outputs.section``. Declaring the same entry again is
    a no-op; a name another guard declares is refused."""
    if outputs in GUARD_OUTPUTS:
        return
    for kind in ('events', 'counters', 'scalars', 'findings', 'sync'):
        for name in getattr(outputs, kind):
            owner = _owner(kind, name)
            if owner is not None:
                raise ValueError(
                    f'{kind[:-1]} {name!r} of {outputs.guard} is declared by '
                    f'{owner.guard} already')
    GUARD_OUTPUTS.append(outputs)


def _matches(declared: str, name: str) -> bool:
    return declared == name or ('{}' in declared and fnmatch.fnmatchcase(
        name, declared.replace('{}', '*')))


def _owner(kind: str, name: str) -> Optional[GuardOutputs]:
    for outputs in GUARD_OUTPUTS:
        if any(_matches(d, name) for d in getattr(outputs, kind)):
            return outputs
    return None


def owner_of(kind: str, name: str) -> GuardOutputs:
    """The entry that declares ``name`` among its ``kind`` (``'events'``,
    ``'counters'``, ``'scalars'`` or ``'findings'``).

    Raises:
        UndeclaredOutputError: no entry declares it.
    """
    owner = _owner(kind, name)
    if owner is None:
        raise UndeclaredOutputError(
            f'[mmsafe] {kind[:-1]} {name!r} is not declared in '
            'mmsafe.guard_outputs.GUARD_OUTPUTS: add it to its guard\'s entry '
            '(or, for a plugin\'s guard, call '
            'mmsafe.guard_outputs.declare_guard)')
    return owner


def section_of(name: str,
               overrides: Optional[Dict[str, str]] = None) -> str:
    """The report section of an event kind or counter key: its guard's
    ``section`` (``overrides`` maps guard names to other sections);
    :data:`Section.OTHER` for a name no guard declares (a counter restored
    from an older run's checkpoint)."""
    owner = _owner('events', name) or _owner('counters', name)
    if owner is None:
        return Section.OTHER
    return (overrides or {}).get(owner.guard, owner.section)


def declared(kind: str) -> Iterable[str]:
    """Every declared name of ``kind``."""
    return [name for outputs in GUARD_OUTPUTS
            for name in getattr(outputs, kind)]

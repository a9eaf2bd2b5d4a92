"""One place to look after a run: ``{work_dir}/safety_report.json``
(:class:`SafetyReportHook`) and what it holds (:class:`SafetyReport`)."""
import json
import logging
import os.path as osp
import time
import traceback
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmengine.hooks import Hook

from mmsafe.registry import HOOKS

from mmsafe.checkpoint import atomic_write
from mmsafe.checkpoint import resume as checkpoint_resume
from mmsafe.datasets import pairing
from mmsafe.dist import all_gather_object, get_rank, get_world_size
from mmsafe.engine.guard_status import guard_statuses, summary_line
from mmsafe.engine.optimizers import (AmpNaNSkipOptimWrapper,
                                      NaNSkipOptimWrapper)
from mmsafe.engine.resume_state import ResumePlan
from mmsafe.engine.run_context import run_context
from mmsafe.engine.runner.safe_runner import SafeRunner
from mmsafe.engine.runner.stop import STOP_INFO
from mmsafe.engine.utils import train_progress
from mmsafe.events import EVENTS_FILE, INFO_PREFIX, jsonable, log
from mmsafe.guard_outputs import (SECTION_ORDER, CounterKey, Event,
                                  GuardOutputs, Section, UnknownGuardError,
                                  outputs_of)
from mmsafe.models.heads.macl_head import MACLHead
from .dataloader_probe_hook import DataLoaderProbeHook
from .divergence_rollback_hook import DivergenceRollbackHook
from .empty_batch_sync_hook import EmptyBatchSyncHook
from .eval_coverage_hook import EvalCoverageHook
from .first_batch_stats_hook import FirstBatchStatsHook
from .hang_watchdog_hook import HangWatchdogHook
from .loss_dict_lint_hook import LossDictLintHook
from .macl_check_hook import MACLCheckHook
from .preemption_hook import PreemptionHook
from .rank_fault_hook import RankFaultHook
from .scalar_bands_hook import ScalarBandsHook
from .skip_aware_param_scheduler_hook import SkipAwareParamSchedulerHook
from .valid_instance_resample_hook import ValidInstanceResampleHook

REPORT_FILE = 'safety_report.json'

#: mmsafe's guards (each declares its ``guard_outputs``), by the name a
#: config or :class:`SafetyReport`'s ``sections`` writes: the registered
#: type name, or the module name of an emitter that is no class.
GUARDS: Dict[str, Any] = {
    emitter.__name__: emitter for emitter in (
        NaNSkipOptimWrapper, AmpNaNSkipOptimWrapper, EmptyBatchSyncHook,
        DataLoaderProbeHook, HangWatchdogHook, MACLCheckHook, MACLHead,
        EvalCoverageHook, RankFaultHook, SafeRunner, PreemptionHook,
        checkpoint_resume, ResumePlan, FirstBatchStatsHook,
        ValidInstanceResampleHook, LossDictLintHook, ScalarBandsHook,
        SkipAwareParamSchedulerHook, pairing, DivergenceRollbackHook)
}


@HOOKS.register_module()
class SafetyReportHook(Hook):
    """Write ``safety_report.json`` and a short table in the log at the end
    of a run, and when the run crashes.

    What it collects:

    * every message hub runtime info key starting with ``'mmsafe/'``
      (:data:`mmsafe.events.INFO_PREFIX`; one key per guard, published with
      :func:`mmsafe.events.update_counters`), from every rank;
    * every record of ``{work_dir}/mmsafe_events.jsonl`` (all ranks and all
      earlier attempts of the run, e.g. before a resume);
    * the **repeated offenders**: the images named in two or more skipped
      optimizer steps (``step_skip`` events, every rank), with the
      iterations and epochs of those steps, most frequent first. A batch
      mate is named once; an image that spikes the gradient whenever it
      comes round is named at every epoch
      (``tools/check_dataset.py CONFIG --files safety_report.json`` checks
      them).

    * **each guard's status** for this run (``guards``): ``active``,
      ``partial`` or ``inactive``, with what it could not see
      (:mod:`mmsafe.engine.guard_status`), and where the run's images,
      files and pairing-sensitive loss terms were found (``modalities``,
      :mod:`mmsafe.engine.modalities`), as rank 0 saw them.

    Both are grouped into sections (rank faults, skipped steps by cause,
    empty batches, loader fallbacks, watchdog events, MACL check,
    evaluation coverage, preemption, resumes): each event kind and counter
    key goes to the section its guard declares on its class (its
    ``guard_outputs``, :mod:`mmsafe.guard_outputs`); guards without a
    section of their own, and names no guard declares, land in ``other``.
    The raw counters and event counts are kept in the report as well.

    When it runs:

    * normal end (``after_run``): one ``all_gather_object`` of the counters,
      called on every rank; rank 0 writes the file. A run that a hook ended
      through :func:`~mmsafe.engine.runner.stop.stop_run` ends normally
      (``status='finished'``; under ``SafeRunner`` also through
      :class:`~mmsafe.engine.runner.StopTraining`), and ``stopped`` holds
      the hook's reason, the iteration and the checkpoint it saved.
    * crash: :meth:`report_crash`, which
      :class:`~mmsafe.engine.runner.SafeRunner` (``runner_type =
      'SafeRunner'``, set by ``configs/_base_/safety_runtime.py``) calls for
      an exception (``KeyboardInterrupt`` included) leaving its ``train``,
      ``val`` or ``test`` (checkpoint loading and resuming included). A
      crash report uses no collective (other ranks may be elsewhere): rank 0
      writes ``safety_report.json``, rank R > 0
      ``safety_report_rank{R}.json``, each with its own counters,
      ``status='crashed'`` (or ``'interrupted'``) and the exception's type,
      message and traceback.
    * not covered: under MMEngine's stock ``Runner`` a crash writes no
      report (a hook sees no exception); a process killed by a signal
      (``kill -9``, the OOM killer, ``SIGTERM`` from a launcher tearing down
      the other ranks) leaves no report either. The events file still holds
      what happened.

    Args:
        sections (Sequence[tuple], optional): ``(section, guards)`` pairs
            that move the outputs of the named guards (registered type
            names, e.g. ``'NaNSkipOptimWrapper'``) to ``section`` (see
            :class:`SafetyReport`).
        max_causes (int): causes listed per section in the log table.

    Raises:
        mmsafe.guard_outputs.UnknownGuardError: a name in ``sections`` is
            no registered guard with declared outputs.
    """

    priority = 'VERY_LOW'  # after every other hook's after_run

    def __init__(
            self,
            sections: Optional[Sequence[Tuple[str, Sequence[str]]]] = None,
            max_causes: int = 4) -> None:
        self.report = SafetyReport(sections, max_causes)
        self.sections = self.report.sections
        self.max_causes = max_causes
        self._started = time.time()
        self._reported_exc: Optional[BaseException] = None

    def before_run(self, runner) -> None:
        self._started = time.time()

    def after_run(self, runner) -> None:
        # Every rank takes part in the gather, whatever its counters.
        states = all_gather_object(SafetyReport.local_state(runner))
        if get_rank() == 0:
            report = self.report.build(runner, 'finished', None, states,
                                       self._started)
            self._write(runner, report, REPORT_FILE)

    def report_crash(self, runner, exc: BaseException,
                     root_cause: Optional[Dict[str, Any]] = None) -> None:
        """Write this rank's crash report for ``exc`` (once per exception;
        no collective). A failure to write is logged, never raised: the
        caller re-raises ``exc``.

        Args:
            runner: the runner whose run failed.
            exc (BaseException): what ended the run.
            root_cause (dict, optional): the failure that started it (the
                rank, iteration, error and what mmsafe knows about it, e.g.
                another rank's record), kept as ``root_cause``.
        """
        if exc is self._reported_exc:
            return
        self._reported_exc = exc
        status = 'interrupted' if isinstance(exc, KeyboardInterrupt) \
            else 'crashed'
        rank = get_rank()
        try:
            report = self.report.build(runner, status, exc,
                                       [SafetyReport.local_state(runner)],
                                       self._started, root_cause)
            name = REPORT_FILE if rank == 0 else \
                f'safety_report_rank{rank}.json'
            self._write(runner, report, name)
        except Exception as err:  # noqa: BLE001 (exc is raised by caller)
            log(f'SafetyReportHook could not write the crash report: '
                f'{type(err).__name__}: {err}', logging.ERROR)

    def _write(self, runner, report: Dict[str, Any], name: str) -> None:
        path = osp.join(runner.work_dir, name)
        text = json.dumps(report, indent=2, sort_keys=False)
        atomic_write(path, lambda f: f.write(text + '\n'), mode='w')
        level = dict(finished=logging.INFO, preempted=logging.WARNING).get(
            report['status'], logging.ERROR)
        log(self.report.table(report, path), level)


class SafetyReport:
    """Builds the report of a run from the events file and the counters of
    every rank, grouped into sections: an event kind or counter key goes to
    the section of the guard that declares it (the ``guard_outputs`` of one
    of mmsafe's :data:`GUARDS`, or of one of the run's hooks: a plugin's
    guard), to ``other`` when none does.

    Args:
        sections (Sequence[tuple], optional): ``(section, guards)`` pairs
            that move the outputs of the named guards to ``section``, a new
            one or one of :data:`~mmsafe.guard_outputs.SECTION_ORDER`. A
            guard is named by its registered type name, as a config writes
            it (``'ScalarBandsHook'``, ``'NaNSkipOptimWrapper'``; a
            registered subclass that inherits the outputs, such as
            ``'AmpNaNSkipOptimWrapper'``, names them too); a plugin's guard
            by the name its class is registered under in ``HOOKS``.
        max_causes (int): causes listed per section in the log table.

    Raises:
        mmsafe.guard_outputs.UnknownGuardError: a name in ``sections`` is
            no registered guard with declared outputs (the message lists
            those that are).
    """

    def __init__(
            self,
            sections: Optional[Sequence[Tuple[str, Sequence[str]]]] = None,
            max_causes: int = 4) -> None:
        self.sections = tuple(
            (name, tuple(guards)) for name, guards in (sections or ()))
        # a guard's declaration -> the section its outputs move to
        self._moved = {_declared(guard): name
                       for name, guards in self.sections for guard in guards}
        self.max_causes = max_causes

    @staticmethod
    def local_state(runner) -> Dict[str, Any]:
        """This rank's ``mmsafe/*`` counters from the message hub."""
        info = runner.message_hub.runtime_info
        counters = {
            key[len(INFO_PREFIX):]: jsonable(value)
            for key, value in info.items() if key.startswith(INFO_PREFIX)
        }
        return dict(rank=get_rank(), counters=counters)

    def section_of(self, name: str,
                   declared: Sequence[GuardOutputs] = ()) -> str:
        """The section of an event kind or counter key: that of the guard
        among mmsafe's :data:`GUARDS` and ``declared`` (a plugin's) that
        declares it, as ``sections`` moves it; ``other`` when none
        does (e.g. a counter restored from an older run's checkpoint)."""
        for outputs in _MMSAFE_OUTPUTS + tuple(declared):
            if name in outputs.names():
                return self._moved.get(outputs, outputs.section)
        return Section.OTHER

    def build(self, runner, status: str, exc: Optional[BaseException],
              states: List[Dict[str, Any]],
              started: float,
              root_cause: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The report: status (a ``'finished'`` run that a stop signal
        ended reads ``'preempted'``), exception, root cause, progress,
        sections, counters."""
        events = _read_events(runner.work_dir)
        table = [outputs for outputs in map(
            outputs_of, getattr(runner, 'hooks', ()))
                 if outputs is not None and outputs not in _MMSAFE_OUTPUTS]
        # mmsafe's sections, then those of plugins' guards and overrides
        names = list(SECTION_ORDER)
        for name in [outputs.section for outputs in table] + [
                n for n, _ in self.sections]:
            if name not in names and name != Section.OTHER:
                names.append(name)
        summary: Dict[str, Dict[str, Any]] = OrderedDict(
            (name, dict(events=0, iterations=0, by_cause={}, counters={},
                        last=None)) for name in names + [Section.OTHER])
        seen_iters: Dict[str, set] = {}
        seen_causes: Dict[str, set] = {}
        by_kind: Dict[str, int] = {}
        for record in events:
            kind = str(record.get('kind', 'unknown'))
            by_kind[kind] = by_kind.get(kind, 0) + 1
            name = self.section_of(kind, table)
            section = summary[name]
            section['events'] += 1
            section['last'] = record
            it = record.get('iter')
            if it is not None:
                seen_iters.setdefault(name, set()).add(it)
            # One cause per (iteration, cause): ranks that report the same
            # collective decision count once.
            for cause in _causes(record):
                key = (it, cause) if it is not None else (id(record), cause)
                if key in seen_causes.setdefault(name, set()):
                    continue
                seen_causes[name].add(key)
                section['by_cause'][cause] = \
                    section['by_cause'].get(cause, 0) + 1
        for name, iters in seen_iters.items():
            summary[name]['iterations'] = len(iters)
        counters: Dict[str, Dict[str, Any]] = {}
        for state in states:
            for guard, values in state['counters'].items():
                counters.setdefault(guard, {})[str(state['rank'])] = values
        for guard, per_rank in counters.items():
            summary[self.section_of(guard, table)]['counters'][guard] = \
                per_rank
        # completed iterations (the hub's 'iter' is the current index)
        epoch, it, max_iters = train_progress(runner)
        preemption = runner.message_hub.get_info(INFO_PREFIX +
                                                 CounterKey.PREEMPTION)
        if preemption:  # the loop stopped inside its last iteration
            epoch, it = preemption.get('epoch', epoch), preemption.get(
                'iter', it)
            if status == 'finished':  # ended by a stop signal
                status = 'preempted'
        report = OrderedDict(
            status=status,
            exception=None if exc is None else dict(
                type=type(exc).__name__,
                message=str(exc),
                traceback=traceback.format_exception(
                    type(exc), exc, exc.__traceback__)[-12:]),
            root_cause=root_cause,
            preemption=preemption,
            stopped=runner.message_hub.get_info(STOP_INFO),
            epoch=epoch,
            iter=it,
            max_iters=max_iters,
            world_size=get_world_size(),
            ranks_reported=[state['rank'] for state in states],
            work_dir=runner.work_dir,
            started=started,
            ended=time.time(),
            duration_s=round(time.time() - started, 3),
            guards=guard_statuses(runner),
            modalities=_modalities(runner),
            summary=summary,
            repeated_offenders=repeated_offenders(events),
            counters=counters,
            events=dict(file=osp.join(runner.work_dir, EVENTS_FILE),
                        total=len(events), by_kind=by_kind),
        )
        return jsonable(report)

    def table(self, report: Dict[str, Any], path: str) -> str:
        """The log table of ``report`` (written to ``path``)."""
        where = (f"epoch {report['epoch']}, iteration {report['iter']}"
                 f"/{report['max_iters']}")
        head = (f"Safety report: {report['status']} at {where} "
                f"({len(report['ranks_reported'])} of "
                f"{report['world_size']} ranks reported) -> {path}")
        lines = [head]
        if report['exception']:
            exc = report['exception']
            lines.append(f"  exception        : {exc['type']}: "
                         f"{exc['message'][:300]}")
        if report.get('stopped'):
            stopped = report['stopped']
            lines.append(f"  stopped by a hook: after iteration "
                         f"{stopped['iter']}: {stopped['reason'][:300]}")
        root = report.get('root_cause')
        if root and root.get('rank') is not None:
            where = (f", iteration {root['iter']}"
                     if root.get('iter') is not None else '')
            lines.append(f"  root cause       : rank {root['rank']}{where}: "
                         f"{root.get('type')}")
        if report.get('guards'):
            lines.append(f"  {'guards':<17}: "
                         f"{summary_line(report['guards'])}")
        for name, section in report['summary'].items():
            if name == Section.OTHER and not section['events'] and \
                    not section['counters']:
                continue
            lines.append(f'  {name:<17}: {self._describe(section)}')
        offenders = report.get('repeated_offenders') or []
        if offenders:
            shown = '; '.join(
                f"{o['file']} ({o['skips']} skips: iterations "
                f"{', '.join(str(i + 1) for i in o['iters'][:4])})"
                for o in offenders[:self.max_causes])
            more = len(offenders) - self.max_causes
            lines.append(f'  {"repeat offenders":<17}: {len(offenders)} '
                         f'images named in 2+ skipped steps: {shown}' +
                         (f' and {more} more' if more > 0 else ''))
        return '\n'.join(lines)

    def _describe(self, section: Dict[str, Any]) -> str:
        parts = []
        if section['events']:
            text = f"{section['events']} events"
            if section['iterations']:
                text += f" at {section['iterations']} iterations"
            causes = sorted(section['by_cause'].items(),
                            key=lambda kv: -kv[1])[:self.max_causes]
            if causes:
                text += ' (' + ', '.join(f'{c}: {n}' for c, n in causes) + ')'
            parts.append(text)
        for guard, per_rank in section['counters'].items():
            values = list(per_rank.values())
            if all(v == values[0] for v in values):
                parts.append(f'{guard}[{_short(values[0])}]')
            else:
                parts.append(f'{guard}[' + ' | '.join(
                    f'rank{r}: {_short(v)}' for r, v in per_rank.items()) +
                             '] (differs across ranks)')
        return '; '.join(parts) if parts else 'none'


def _modalities(runner) -> Optional[Dict[str, Any]]:
    """What the run's modalities description used (None when no guard
    read it)."""
    found = getattr(run_context(runner), 'modalities', None)
    return found.describe() if found is not None else None


def _short(values: Any, limit: int = 6) -> str:
    if isinstance(values, dict):
        return ', '.join(f'{k}={v}' for k, v in list(values.items())[:limit])
    return str(values)


def _read_events(work_dir: Optional[str]) -> List[Dict[str, Any]]:
    """Records of the events file; a line cut short by a killed writer is
    skipped rather than failing the report."""
    path = osp.join(work_dir or '', EVENTS_FILE)
    if not work_dir or not osp.exists(path):
        return []
    records = []
    with open(path, encoding='utf-8') as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def repeated_offenders(events: List[Dict[str, Any]],
                       min_skips: int = 2) -> List[Dict[str, Any]]:
    """The images named in at least ``min_skips`` skipped optimizer steps.

    Args:
        events (list[dict]): records of the events file (every rank).
        min_skips (int): skipped steps an image must be named in.

    Returns:
        list[dict]: per image ``file``, ``skips`` (distinct skipped steps),
        ``iters`` and ``epochs`` (sorted, 0-based) and ``reasons``, most
        skips first.
    """
    seen: Dict[str, Dict[str, Any]] = {}
    for record in events:
        if record.get('kind') != Event.STEP_SKIP:
            continue
        it = record.get('iter')
        for name in record.get('files') or []:
            entry = seen.setdefault(str(name), dict(steps=set(), iters=set(),
                                                    epochs=set(),
                                                    reasons=set()))
            # a rolled-back run may see an iteration number twice: the
            # event's time tells the steps apart
            entry['steps'].add((it, record.get('time')))
            if it is not None:
                entry['iters'].add(int(it))
            if record.get('epoch') is not None:
                entry['epochs'].add(int(record['epoch']))
            entry['reasons'].update(str(r) for r in
                                    record.get('reasons') or [])
    found = [dict(file=name, skips=len(e['steps']),
                  iters=sorted(e['iters']), epochs=sorted(e['epochs']),
                  reasons=sorted(e['reasons']))
             for name, e in seen.items() if len(e['steps']) >= min_skips]
    return sorted(found, key=lambda o: (-o['skips'], o['file']))


def _causes(record: Dict[str, Any]) -> List[str]:
    for field in ('reasons', 'cause', 'reason', 'status'):
        value = record.get(field)
        if isinstance(value, list) and value:
            return [str(v) for v in value]
        if value not in (None, '', []):
            return [str(value)]
    return [str(record.get('kind', 'unknown'))]


#: the declarations of mmsafe's guards (a subclass that inherits one, such
#: as AmpNaNSkipOptimWrapper, shares it)
_MMSAFE_OUTPUTS: Tuple[GuardOutputs, ...] = tuple(dict.fromkeys(
    outputs_of(emitter) for emitter in GUARDS.values()))


def _declared(name: str) -> GuardOutputs:
    """The declaration of the guard named ``name``: one of :data:`GUARDS`,
    else a hook registered as ``name`` that declares outputs.

    Raises:
        UnknownGuardError: none is; the message lists mmsafe's guards.
    """
    emitter = GUARDS.get(name) or HOOKS.get(name)
    outputs = None if emitter is None else outputs_of(emitter)
    if outputs is None:
        raise UnknownGuardError(
            f'[mmsafe] {name!r} is not a registered guard with declared '
            f'outputs; mmsafe\'s are: {", ".join(sorted(GUARDS))}')
    return outputs

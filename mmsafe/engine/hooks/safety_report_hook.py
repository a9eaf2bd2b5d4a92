"""One place to look after a run: ``{work_dir}/safety_report.json``."""
import json
import logging
import os.path as osp
import sys
import time
import traceback
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mmengine.hooks import Hook
from mmengine.runner import BaseLoop

from mmdet.registry import HOOKS

from mmsafe.checkpoint import atomic_write
from mmsafe.dist import all_gather_object, get_rank, get_world_size
from mmsafe.events import EVENTS_FILE, INFO_PREFIX, _jsonable, log

REPORT_FILE = 'safety_report.json'

# Section -> substrings of event kinds / counter (guard) names, tried in this
# order; the first section with a matching substring takes the item.
DEFAULT_SECTIONS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('resumes', ('resume', )),
    ('watchdog_events', ('watchdog', 'hang', 'stall')),
    ('macl_check', ('macl', )),
    ('eval_coverage', ('eval', 'coverage')),
    ('empty_batches', ('empty', )),
    ('loader_fallbacks', ('fallback', 'loader', 'probe')),
    ('skipped_steps', ('skip', 'step_guard', 'nan', 'overflow')),
)


# Order of the sections in the report and the log table.
DISPLAY_ORDER = ('skipped_steps', 'empty_batches', 'loader_fallbacks',
                 'watchdog_events', 'macl_check', 'eval_coverage', 'resumes')


@HOOKS.register_module()
class SafetyReportHook(Hook):
    """Write ``safety_report.json`` and a short table in the log at the end
    of a run, and when the run crashes.

    What it collects:

    * every message hub runtime info key starting with ``'mmsafe/'``
      (:data:`mmsafe.events.INFO_PREFIX`; one key per guard, published with
      :func:`mmsafe.events.update_counters`), from every rank;
    * every record of ``{work_dir}/mmsafe_events.jsonl`` (all ranks and all
      earlier attempts of the run, e.g. before a resume).

    Both are grouped into sections (skipped steps by cause, empty batches,
    loader fallbacks, watchdog events, MACL check, evaluation coverage,
    resumes) by substrings of the event kind or guard name
    (``sections``); what matches none lands in ``other``. The raw counters
    and event counts are kept in the report as well.

    When it runs:

    * normal end (``after_run``): one ``all_gather_object`` of the counters,
      called on every rank; rank 0 writes the file.
    * crash: an exception (``KeyboardInterrupt`` included) leaving the
      runner's loops (``train_loop.run``, ``val_loop.run``,
      ``test_loop.run``) or ``load_or_resume``, which are wrapped in
      ``before_run``; anything else that ends the process with an uncaught
      exception is caught by ``sys.excepthook``. A crash report uses no
      collective (other ranks may be elsewhere): rank 0 writes
      ``safety_report.json``, rank R > 0 ``safety_report_rank{R}.json``,
      each with its own counters, ``status='crashed'`` (or
      ``'interrupted'``) and the exception's type, message and traceback.
    * not covered: a process killed by a signal (``kill -9``, the OOM
      killer, ``SIGTERM`` from a launcher tearing down the other ranks)
      leaves no report; the events file still holds what happened.

    Args:
        sections (Sequence[tuple], optional): ``(section, substrings)``
            pairs replacing :data:`DEFAULT_SECTIONS`.
        max_causes (int): causes listed per section in the log table.
    """

    priority = 'VERY_LOW'  # after every other hook's after_run

    def __init__(
            self,
            sections: Optional[Sequence[Tuple[str, Sequence[str]]]] = None,
            max_causes: int = 4) -> None:
        self.sections = tuple(
            (name, tuple(keys)) for name, keys in (sections or
                                                   DEFAULT_SECTIONS))
        self.max_causes = max_causes
        self._started = time.time()
        self._reported_exc: Optional[BaseException] = None
        self._finished = False
        self._previous_excepthook: Optional[Callable] = None

    # ------------------------------------------------------------------
    # hook points
    # ------------------------------------------------------------------
    def before_run(self, runner) -> None:
        self._started = time.time()
        self._finished = False
        for attr in ('_train_loop', '_val_loop', '_test_loop'):
            loop = getattr(runner, attr, None)
            if isinstance(loop, BaseLoop):
                loop.run = self._guard(loop.run, runner)
        runner.load_or_resume = self._guard(runner.load_or_resume, runner)
        self._previous_excepthook = sys.excepthook
        previous = sys.excepthook

        def excepthook(exc_type, exc, tb):
            if not self._finished:
                self.report_crash(runner, exc)
            previous(exc_type, exc, tb)

        sys.excepthook = excepthook

    def after_run(self, runner) -> None:
        self._finished = True
        if self._previous_excepthook is not None:
            sys.excepthook = self._previous_excepthook
            self._previous_excepthook = None
        # Every rank takes part in the gather, whatever its counters.
        states = all_gather_object(self._local_state(runner))
        if get_rank() == 0:
            report = self._build_report(runner, 'finished', None, states)
            self._write(runner, report, REPORT_FILE)

    # ------------------------------------------------------------------
    # crash path
    # ------------------------------------------------------------------
    def _guard(self, fn: Callable, runner) -> Callable:
        if getattr(fn, '_mmsafe_safety_report', False):
            return fn

        def guarded(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                self.report_crash(runner, exc)
                raise

        guarded._mmsafe_safety_report = True
        return guarded

    def report_crash(self, runner, exc: BaseException) -> None:
        if exc is self._reported_exc:
            return
        self._reported_exc = exc
        status = 'interrupted' if isinstance(exc, KeyboardInterrupt) \
            else 'crashed'
        rank = get_rank()
        try:
            report = self._build_report(runner, status, exc,
                                        [self._local_state(runner)])
            name = REPORT_FILE if rank == 0 else \
                f'safety_report_rank{rank}.json'
            self._write(runner, report, name)
        except Exception as err:  # never hide the exception being raised
            log(f'SafetyReportHook could not write the crash report: '
                f'{type(err).__name__}: {err}', logging.ERROR)

    # ------------------------------------------------------------------
    # report
    # ------------------------------------------------------------------
    @staticmethod
    def _local_state(runner) -> Dict[str, Any]:
        info = runner.message_hub.runtime_info
        counters = {
            key[len(INFO_PREFIX):]: _jsonable(value)
            for key, value in info.items() if key.startswith(INFO_PREFIX)
        }
        return dict(rank=get_rank(), counters=counters)

    def _section_of(self, name: str) -> str:
        lowered = name.lower()
        for section, keys in self.sections:
            if any(key in lowered for key in keys):
                return section
        return 'other'

    def _build_report(self, runner, status: str,
                      exc: Optional[BaseException],
                      states: List[Dict[str, Any]]) -> Dict[str, Any]:
        hub = runner.message_hub
        events = _read_events(runner.work_dir)
        names = [n for n in DISPLAY_ORDER
                 if n in dict(self.sections)] + [
                     n for n, _ in self.sections if n not in DISPLAY_ORDER]
        summary: Dict[str, Dict[str, Any]] = OrderedDict(
            (name, dict(events=0, iterations=0, by_cause={}, counters={},
                        last=None)) for name in names + ['other'])
        seen_iters: Dict[str, set] = {}
        seen_causes: Dict[str, set] = {}
        by_kind: Dict[str, int] = {}
        for record in events:
            kind = str(record.get('kind', 'unknown'))
            by_kind[kind] = by_kind.get(kind, 0) + 1
            section = summary[self._section_of(kind)]
            section['events'] += 1
            section['last'] = record
            it = record.get('iter')
            name = self._section_of(kind)
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
            summary[self._section_of(guard)]['counters'][guard] = per_rank
        loop = getattr(runner, '_train_loop', None)
        if isinstance(loop, BaseLoop):
            # Completed iterations (the hub's 'iter' is the current index).
            epoch, it, max_iters = loop.epoch, loop.iter, loop.max_iters
        else:
            epoch, it, max_iters = (hub.get_info('epoch'),
                                    hub.get_info('iter'),
                                    hub.get_info('max_iters'))
        report = OrderedDict(
            status=status,
            exception=None if exc is None else dict(
                type=type(exc).__name__,
                message=str(exc),
                traceback=traceback.format_exception(
                    type(exc), exc, exc.__traceback__)[-12:]),
            epoch=epoch,
            iter=it,
            max_iters=max_iters,
            world_size=get_world_size(),
            ranks_reported=[state['rank'] for state in states],
            work_dir=runner.work_dir,
            started=self._started,
            ended=time.time(),
            duration_s=round(time.time() - self._started, 3),
            summary=summary,
            counters=counters,
            events=dict(file=osp.join(runner.work_dir, EVENTS_FILE),
                        total=len(events), by_kind=by_kind),
        )
        return _jsonable(report)

    def _write(self, runner, report: Dict[str, Any], name: str) -> None:
        path = osp.join(runner.work_dir, name)
        text = json.dumps(report, indent=2, sort_keys=False)
        atomic_write(path, lambda f: f.write(text + '\n'), mode='w')
        level = logging.INFO if report['status'] == 'finished' \
            else logging.ERROR
        log(self._table(report, path), level)

    def _table(self, report: Dict[str, Any], path: str) -> str:
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
        for name, section in report['summary'].items():
            if name == 'other' and not section['events'] and \
                    not section['counters']:
                continue
            lines.append(f'  {name:<17}: {self._describe(section)}')
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


def _causes(record: Dict[str, Any]) -> List[str]:
    for field in ('reasons', 'cause', 'reason', 'status'):
        value = record.get(field)
        if isinstance(value, list) and value:
            return [str(v) for v in value]
        if value not in (None, '', []):
            return [str(value)]
    return [str(record.get('kind', 'unknown'))]

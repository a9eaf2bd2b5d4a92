"""The content of ``safety_report.json`` and its log table (see
:class:`~mmsafe.engine.hooks.SafetyReportHook`)."""
import json
import os.path as osp
import time
import traceback
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmsafe.dist import get_rank, get_world_size
from mmsafe.engine.utils import train_progress
from mmsafe.events import EVENTS_FILE, INFO_PREFIX, _jsonable

# Section -> substrings of event kinds / counter (guard) names, tried in this
# order; the first section with a matching substring takes the item.
DEFAULT_SECTIONS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('rank_faults', ('rank_fault', 'rank_failed')),
    ('preemption', ('preempt', )),
    ('resumes', ('resume', )),
    ('watchdog_events', ('watchdog', 'hang', 'stall')),
    ('macl_check', ('macl', )),
    ('eval_coverage', ('eval', 'coverage')),
    ('empty_batches', ('empty', )),
    ('loader_fallbacks', ('fallback', 'loader', 'probe')),
    ('skipped_steps', ('skip', 'step_guard', 'nan', 'overflow')),
)

# Order of the sections in the report and the log table.
DISPLAY_ORDER = ('rank_faults', 'skipped_steps', 'empty_batches',
                 'loader_fallbacks', 'watchdog_events', 'macl_check',
                 'eval_coverage', 'preemption', 'resumes')


class SafetyReport:
    """Builds the report of a run from the events file and the counters of
    every rank, grouped into sections.

    Args:
        sections (Sequence[tuple], optional): ``(section, substrings)``
            pairs replacing :data:`DEFAULT_SECTIONS`.
        max_causes (int): causes listed per section in the log table.
    """

    def __init__(self,
                 sections: Optional[Sequence[Tuple[str, Sequence[str]]]] = None,
                 max_causes: int = 4) -> None:
        self.sections = tuple(
            (name, tuple(keys)) for name, keys in (sections or
                                                   DEFAULT_SECTIONS))
        self.max_causes = max_causes

    @staticmethod
    def local_state(runner) -> Dict[str, Any]:
        """This rank's ``mmsafe/*`` counters from the message hub."""
        info = runner.message_hub.runtime_info
        counters = {
            key[len(INFO_PREFIX):]: _jsonable(value)
            for key, value in info.items() if key.startswith(INFO_PREFIX)
        }
        return dict(rank=get_rank(), counters=counters)

    def section_of(self, name: str) -> str:
        """The section of an event kind or guard name."""
        lowered = name.lower()
        for section, keys in self.sections:
            if any(key in lowered for key in keys):
                return section
        return 'other'

    def build(self, runner, status: str, exc: Optional[BaseException],
              states: List[Dict[str, Any]],
              started: float,
              root_cause: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The report: status (a ``'finished'`` run that a stop signal
        ended reads ``'preempted'``), exception, root cause, progress,
        sections, counters."""
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
            section = summary[self.section_of(kind)]
            section['events'] += 1
            section['last'] = record
            it = record.get('iter')
            name = self.section_of(kind)
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
            summary[self.section_of(guard)]['counters'][guard] = per_rank
        # completed iterations (the hub's 'iter' is the current index)
        epoch, it, max_iters = train_progress(runner)
        preemption = runner.message_hub.get_info(INFO_PREFIX + 'preemption')
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
            epoch=epoch,
            iter=it,
            max_iters=max_iters,
            world_size=get_world_size(),
            ranks_reported=[state['rank'] for state in states],
            work_dir=runner.work_dir,
            started=started,
            ended=time.time(),
            duration_s=round(time.time() - started, 3),
            summary=summary,
            counters=counters,
            events=dict(file=osp.join(runner.work_dir, EVENTS_FILE),
                        total=len(events), by_kind=by_kind),
        )
        return _jsonable(report)

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
        root = report.get('root_cause')
        if root and root.get('rank') is not None:
            where = (f", iteration {root['iter']}"
                     if root.get('iter') is not None else '')
            lines.append(f"  root cause       : rank {root['rank']}{where}: "
                         f"{root.get('type')}")
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

"""One place to look after a run: ``{work_dir}/safety_report.json``."""
import json
import logging
import os.path as osp
import time
from typing import Any, Dict, Optional, Sequence, Tuple

from mmengine.hooks import Hook

from mmdet.registry import HOOKS

from mmsafe.checkpoint import atomic_write
from mmsafe.dist import all_gather_object, get_rank
from mmsafe.engine.safety_report import SafetyReport
from mmsafe.events import log

REPORT_FILE = 'safety_report.json'


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
      called on every rank; rank 0 writes the file. A run that a hook ended
      with :class:`~mmsafe.engine.runner.StopTraining` under ``SafeRunner``
      ends normally.
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
        sections (Sequence[tuple], optional): ``(section, substrings)``
            pairs replacing
            :data:`mmsafe.engine.safety_report.DEFAULT_SECTIONS`.
        max_causes (int): causes listed per section in the log table.
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

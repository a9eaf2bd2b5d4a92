"""What a guard of mmsafe leaves behind, declared once, next to the guard.

A guard reports through three outputs (:mod:`mmsafe.events`):

* **events**: records of ``{work_dir}/mmsafe_events.jsonl``, each with a
  ``kind`` (:func:`mmsafe.events.write_event`);
* **counters**: one dict per key in the runner's message hub, under
  ``mmsafe/<key>`` (:func:`mmsafe.events.update_counters`);
* **scalars**: ``train/*`` values in the message hub
  (:func:`mmsafe.events.update_scalar`), which MMEngine's logger and
  visualizer backends show.

The class that emits them (the module, for an emitter that is no class)
declares them as its ``guard_outputs`` attribute, a :class:`GuardOutputs`,
with the ``safety_report.json`` section they land in::

    @HOOKS.register_module()
    class HangWatchdogHook(Hook):
        guard_outputs = GuardOutputs(
            Section.WATCHDOG_EVENTS, events=(Event.HANG, Event.HANG_ABORT),
            counters=(CounterKey.HANG_WATCHDOG, ))

``Event.HANG`` is the string ``'hang'``, ``CounterKey.HANG_WATCHDOG`` the
string ``'hang_watchdog'`` and ``Scalar.GRAD_NORM`` the string
``'train/grad_norm'`` (:class:`Event`, :class:`CounterKey`,
:class:`Scalar`): the name spelled as a constant, so that a typo is a name
no guard declares. A plugin may write the strings.

Nothing is checked while a run trains: tests/test_guard_outputs.py reads
mmsafe's source and fails on an emitted name that no guard of mmsafe
declares, on a name two guards declare and on a declared name that is
never emitted. ``SafetyReportHook`` files each event kind and
counter key under its guard's section: mmsafe's guards are listed in
:mod:`mmsafe.engine.hooks.safety_report_hook`, a plugin's guard is one of
the run's hooks.

This module imports nothing from mmsafe but :mod:`mmsafe.errors`.
"""
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Optional, Tuple

from mmsafe.errors import MMSafeAttributeError, MMSafeValueError


class Section:
    """Sections of ``safety_report.json``, in the order the report and its
    log table show them (:data:`SECTION_ORDER`)."""
    RANK_FAULTS = 'rank_faults'
    SKIPPED_STEPS = 'skipped_steps'
    ROLLBACKS = 'rollbacks'
    EMPTY_BATCHES = 'empty_batches'
    LOADER_FALLBACKS = 'loader_fallbacks'
    WATCHDOG_EVENTS = 'watchdog_events'
    MACL_CHECK = 'macl_check'
    EVAL_COVERAGE = 'eval_coverage'
    PREEMPTION = 'preemption'
    RESUMES = 'resumes'
    OTHER = 'other'


SECTION_ORDER: Tuple[str, ...] = (
    Section.RANK_FAULTS, Section.SKIPPED_STEPS, Section.ROLLBACKS,
    Section.EMPTY_BATCHES, Section.LOADER_FALLBACKS, Section.WATCHDOG_EVENTS,
    Section.MACL_CHECK, Section.EVAL_COVERAGE, Section.PREEMPTION,
    Section.RESUMES)


class _Spelled(type):
    """``Namespace.SOME_NAME`` is ``prefix + 'some_name'``."""

    def __getattr__(cls, name: str) -> str:
        if not name.isupper() or name.startswith('_'):
            raise MMSafeAttributeError(name)
        return cls.prefix + name.lower()


class Event(metaclass=_Spelled):
    """Event kinds: ``Event.STEP_SKIP`` is ``'step_skip'``."""
    prefix = ''


class CounterKey(metaclass=_Spelled):
    """Counter keys: ``CounterKey.STEP_GUARD`` is ``'step_guard'``, held in
    the message hub as ``mmsafe/step_guard``."""
    prefix = ''


class Scalar(metaclass=_Spelled):
    """``train/*`` scalars: ``Scalar.GRAD_NORM`` is ``'train/grad_norm'``."""
    prefix = 'train/'


@dataclass(frozen=True)
class GuardOutputs:
    """The declared outputs of one guard: the value of its
    ``guard_outputs`` attribute.

    Args:
        section (str): the ``safety_report.json`` section of its events and
            counters (:class:`Section`, or a plugin's own).
        events (tuple[str]): kinds of its event records.
        counters (tuple[str]): its message hub counter keys.
        scalars (tuple[str]): its ``train/*`` scalars; ``{}`` stands for a
            part chosen at run time (``'train/grad_norm_{}'``).
    """
    section: str
    events: Tuple[str, ...] = ()
    counters: Tuple[str, ...] = ()
    scalars: Tuple[str, ...] = ()

    def names(self) -> Tuple[str, ...]:
        """Its event kinds and counter keys (what a report section
        holds)."""
        return self.events + self.counters


def outputs_of(emitter: Any) -> Optional[GuardOutputs]:
    """The :class:`GuardOutputs` that a guard declares: ``emitter`` is its
    class, an instance of it, or its module; None when it declares none."""
    if not isinstance(emitter, (type, ModuleType)):
        emitter = type(emitter)
    outputs = getattr(emitter, 'guard_outputs', None)
    return outputs if isinstance(outputs, GuardOutputs) else None


class UnknownGuardError(MMSafeValueError):
    """A name that is no guard with declared outputs."""

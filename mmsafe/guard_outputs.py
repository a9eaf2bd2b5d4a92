"""What every guard of mmsafe leaves behind, declared on the guard itself.

A guard reports through three channels (:mod:`mmsafe.events`):

* **events**: records of ``{work_dir}/mmsafe_events.jsonl``, one per thing
  that happened, with a ``kind`` (:class:`Event`);
* **counters**: one dict per guard in the runner's message hub, under
  ``mmsafe/<key>`` (:class:`CounterKey`), gathered by ``SafetyReportHook``;
* **scalars**: ``train/*`` values in the message hub (:class:`Scalar`),
  which MMEngine's logger and visualizer backends (TensorBoard, ...) show.

A guard that speaks to rank 0 through the rank channel names its
**finding** (:class:`Finding`), and one that sums a value over ranks names
it in the run's monitor sync (:class:`Sync`).

Each name is spelled once, as a constant of these namespaces. Which guard
emits it, and the ``safety_report.json`` section it lands in, is declared
on the guard: the class that emits it has a ``guard_outputs`` attribute
(:data:`OUTPUTS_ATTR`), a :class:`GuardOutputs`::

    @HOOKS.register_module()
    class HangWatchdogHook(Hook):
        guard_outputs = GuardOutputs(
            Section.WATCHDOG_EVENTS, events=(Event.HANG, Event.HANG_ABORT),
            counters=(CounterKey.HANG_WATCHDOG, ))

The table of declared outputs (:class:`DeclaredOutputs`) is collected from
MMEngine's registries (every root registry and its children: MMDetection's,
mmsafe's scope, a plugin's), keyed by the **registered type name** a config
writes (``'NaNSkipOptimWrapper'``); a registered subclass that inherits the
declaration answers to its own name too (``'AmpNaNSkipOptimWrapper'``).
The few emitters that no registry holds (:data:`UNREGISTERED_EMITTERS`)
are listed here by name and found among the imported modules, so this
module imports none of them. A plugin's guard declares its outputs by
defining the attribute on its registered class; nothing else is called.

:func:`mmsafe.events.write_event`, :func:`mmsafe.events.update_counters`,
:func:`mmsafe.events.update_scalar` and
:func:`mmsafe.engine.rank_channel.share_finding` refuse a name that no
guard declares (:func:`owner_of`; the monitor sync itself takes any name,
tests/test_guard_outputs.py checks that the guards post declared ones).

This module imports nothing from mmsafe but :mod:`mmsafe.errors` (which
imports nothing from mmsafe), so every part of mmsafe can import it;
MMEngine's registry is imported when the table is first collected.
"""
import fnmatch
import sys
from dataclasses import dataclass
from typing import (Any, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

from mmsafe.errors import MMSafeValueError


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
    Section.EMPTY_BATCHES,
    Section.LOADER_FALLBACKS, Section.WATCHDOG_EVENTS, Section.MACL_CHECK,
    Section.EVAL_COVERAGE, Section.PREEMPTION, Section.RESUMES)


class Event:
    """Kinds of the records of ``mmsafe_events.jsonl``."""
    STEP_SKIP = 'step_skip'
    ROLLBACK = 'rollback'
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


class CounterKey:
    """Message hub keys of the guards' counters (``mmsafe/<key>``)."""
    STEP_GUARD = 'step_guard'
    ROLLBACK = 'rollback'
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
    SPIKE_SKIPS = 'train/spike_skips'
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
    ROLLBACK_LOSS = 'divergence_rollback/loss'


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
    """The declared outputs of one guard: the value of its
    ``guard_outputs`` attribute (:data:`OUTPUTS_ATTR`).

    Args:
        section (str): the ``safety_report.json`` section of its events and
            counters (:class:`Section`, or a plugin's own).
        events (tuple[str]): kinds of its event records.
        counters (tuple[str]): its message hub counter keys.
        scalars (tuple[str]): its ``train/*`` scalars; ``{}`` stands for a
            part chosen at run time (a config pattern, ...).
        findings (tuple[str]): kinds of its rank-channel findings, with
            ``{}`` as in ``scalars``.
        sync (tuple[str]): the names it posts to the monitor sync, with
            ``{}`` as in ``scalars``.
    """
    section: str
    events: Tuple[str, ...] = ()
    counters: Tuple[str, ...] = ()
    scalars: Tuple[str, ...] = ()
    findings: Tuple[str, ...] = ()
    sync: Tuple[str, ...] = ()


#: the attribute of a guard's class (or module) that holds its GuardOutputs
OUTPUTS_ATTR = 'guard_outputs'

#: the kinds of outputs, the fields of :class:`GuardOutputs` that name them
KINDS = ('events', 'counters', 'scalars', 'findings', 'sync')

#: emitters that no registry holds: modules, and classes as
#: ``'module:Class'``. They are looked up among the imported modules
#: (importing ``mmsafe`` imports them all); one not imported has emitted
#: nothing.
UNREGISTERED_EMITTERS: Tuple[str, ...] = (
    'mmsafe.checkpoint.resume',
    'mmsafe.engine.resume_state:ResumePlan',
    'mmsafe.datasets.pairing',
)


@dataclass(frozen=True)
class Guard:
    """A component that declares outputs, as collected.

    Args:
        name (str): its registered type name (the name of the module, or of
            the class, for one of :data:`UNREGISTERED_EMITTERS`).
        emitter: the class (or module) whose attribute declares them.
        outputs (GuardOutputs): what it declares.
        aliases (tuple[str]): registered type names of subclasses that
            inherit the declaration.
    """
    name: str
    emitter: Any
    outputs: GuardOutputs
    aliases: Tuple[str, ...] = ()


class UndeclaredOutputError(MMSafeValueError):
    """A guard emitted an event, counter, scalar or finding that no guard
    declares."""


class UnknownGuardError(MMSafeValueError):
    """A name that is no registered guard with declared outputs."""


def _matches(declared: str, name: str) -> bool:
    return declared == name or ('{}' in declared and fnmatch.fnmatchcase(
        name, declared.replace('{}', '*')))


class DeclaredOutputs:
    """The declared outputs of every guard (built by :func:`collect`).

    Args:
        guards (Sequence[Guard]): the guards.

    Raises:
        ValueError: two guards declare the same output, or answer to the
            same name.
    """

    def __init__(self, guards: Sequence[Guard]) -> None:
        self.guards: Tuple[Guard, ...] = tuple(guards)
        self._by_name: Dict[str, Guard] = {}
        for guard in self.guards:
            for name in (guard.name, ) + guard.aliases:
                other = self._by_name.setdefault(name, guard)
                if other is not guard:
                    raise MMSafeValueError(
                        f'[mmsafe] two guards answer to {name!r}: '
                        f'{_where(other.emitter)} and {_where(guard.emitter)}')
        for kind in KINDS:
            seen: Dict[str, Guard] = {}
            for guard in self.guards:
                for name in getattr(guard.outputs, kind):
                    other = seen.setdefault(name, guard)
                    if other is not guard:
                        raise MMSafeValueError(
                            f'[mmsafe] {kind[:-1]} {name!r} is declared by '
                            f'{other.name} ({_where(other.emitter)}) and by '
                            f'{guard.name} ({_where(guard.emitter)})')
        # (kind, name) -> its guard or None, filled as names are looked up:
        # a name emitted every iteration costs one dict lookup
        self._owners: Dict[Tuple[str, str], Optional[Guard]] = {}

    def owner(self, kind: str, name: str) -> Optional[Guard]:
        """The guard that declares ``name`` among its ``kind`` (one of
        :data:`KINDS`), None when none does."""
        key = (kind, name)
        try:
            return self._owners[key]
        except KeyError:
            pass
        guard = next((candidate for candidate in self.guards if any(
            _matches(d, name) for d in getattr(candidate.outputs, kind))),
                     None)
        self._owners[key] = guard
        return guard

    def guard(self, name: str) -> Guard:
        """The guard registered as ``name`` (or a subclass of it).

        Raises:
            UnknownGuardError: no registered guard with declared outputs
                answers to ``name``; the message lists those that do.
        """
        guard = self._by_name.get(name)
        if guard is None:
            raise UnknownGuardError(
                f'[mmsafe] {name!r} is not a registered guard with declared '
                f'outputs; these are: {", ".join(self.names())}')
        return guard

    def names(self) -> List[str]:
        """Every name a guard answers to, sorted."""
        return sorted(self._by_name)

    def section_of(self, name: str,
                   moved: Optional[Dict[str, str]] = None) -> str:
        """The report section of an event kind or counter key: its guard's
        ``section`` (``moved`` maps guard names to other sections);
        :data:`Section.OTHER` for a name no guard declares (a counter
        restored from an older run's checkpoint)."""
        guard = self.owner('events', name) or self.owner('counters', name)
        if guard is None:
            return Section.OTHER
        return (moved or {}).get(guard.name, guard.outputs.section)


def _where(emitter: Any) -> str:
    """``module.Class`` of a class, the name of a module."""
    if isinstance(emitter, type):
        return f'{emitter.__module__}.{emitter.__qualname__}'
    return emitter.__name__


def _registries() -> Iterator[Any]:
    """Every registry of MMEngine: its roots and their children (scopes of
    MMDetection, mmsafe, plugins), breadth first."""
    from mmengine import registry as mmengine_registry
    queue = [obj for obj in vars(mmengine_registry).values()
             if isinstance(obj, mmengine_registry.Registry)]
    seen = set()
    while queue:
        registry = queue.pop(0)
        if id(registry) in seen:
            continue
        seen.add(id(registry))
        yield registry
        queue.extend(registry.children.values())


def _declaring_class(cls: type) -> Optional[type]:
    """The class of ``cls``'s MRO whose own attribute declares outputs."""
    for klass in cls.__mro__:
        if isinstance(vars(klass).get(OUTPUTS_ATTR), GuardOutputs):
            return klass
    return None


def _unregistered() -> Iterator[Tuple[str, Any]]:
    for path in UNREGISTERED_EMITTERS:
        module_name, _, attr = path.partition(':')
        module = sys.modules.get(module_name)
        emitter = getattr(module, attr, None) if attr else module
        if emitter is not None:
            yield attr or module_name, emitter


def collect() -> DeclaredOutputs:
    """Walk the registries for the classes that declare outputs, add
    :data:`UNREGISTERED_EMITTERS`, and make the result the table that
    :func:`owner_of` checks against.

    Raises:
        ValueError: two guards declare the same output, or answer to the
            same name.
    """
    # declaring class -> (registered names of it, of subclasses inheriting)
    found: Dict[type, Tuple[List[str], List[str]]] = {}
    for registry in _registries():
        for name, obj in list(registry.module_dict.items()):
            if not isinstance(obj, type) or \
                    getattr(obj, OUTPUTS_ATTR, None) is None:
                continue
            klass = _declaring_class(obj)
            if klass is None:
                continue
            own, inherited = found.setdefault(klass, ([], []))
            names = own if obj is klass else inherited
            if name not in names:
                names.append(name)
    guards = []
    for klass, (own, inherited) in found.items():
        name = klass.__name__ if klass.__name__ in own or not own else own[0]
        aliases = [n for n in own + inherited if n != name]
        guards.append(Guard(name, klass, vars(klass)[OUTPUTS_ATTR],
                            tuple(aliases)))
    for name, emitter in _unregistered():
        outputs = getattr(emitter, OUTPUTS_ATTR, None)
        if isinstance(outputs, GuardOutputs):
            guards.append(Guard(name, emitter, outputs))
    table = DeclaredOutputs(guards)
    global _table
    _table = table
    return table


_table: Optional[DeclaredOutputs] = None


def declared_outputs() -> DeclaredOutputs:
    """The table :func:`collect` built last (collected on first use)."""
    return _table if _table is not None else collect()


def owner_of(kind: str, name: str) -> Guard:
    """The guard that declares ``name`` among its ``kind`` (one of
    :data:`KINDS`). A name missing from the table collected last is looked
    up once more in a fresh one (a class registered since then).

    Raises:
        UndeclaredOutputError: no guard declares it.
    """
    guard = declared_outputs().owner(kind, name)
    if guard is None:
        guard = collect().owner(kind, name)
    if guard is None:
        raise UndeclaredOutputError(
            f'[mmsafe] {kind[:-1]} {name!r} is not declared by any guard: '
            f'add it to the {OUTPUTS_ATTR!r} attribute (a '
            'mmsafe.guard_outputs.GuardOutputs) of the registered class '
            'that emits it')
    return guard

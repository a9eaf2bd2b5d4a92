"""What every guard leaves behind is declared once, next to the guard (its
``guard_outputs``, mmsafe/guard_outputs.py), and checked here, not while a
run trains.

* a source scan (AST) of ``mmsafe/``: every ``write_event``,
  ``update_counters`` and ``update_scalar`` names its output statically
  (a string, ``Event.X``/``CounterKey.X``/``Scalar.X``, a module constant,
  ``'...{}'.format(...)``), every such name is declared by one of mmsafe's
  guards, every declared name is emitted, and no code publishes a scalar
  past ``update_scalar``;
* every class or module that declares outputs is one of the report's
  :data:`~mmsafe.engine.hooks.safety_report_hook.GUARDS`, under the type
  name it is registered as, and no name is declared twice;
* the safety report files each output under its guard's section, moves a
  guard named by its registered type name, and files a plugin's guard (one
  of the run's hooks) under the section it declares;
* an event's message is logged with the event's kind, by which the rank
  channel forwards it to rank 0.
"""
import ast
import fnmatch
import logging
import pathlib
from types import SimpleNamespace

import pytest
from mmengine.hooks import Hook
from mmengine.logging import MessageHub, MMLogger

from mmdet import registry as mmdet_registry
from mmsafe import guard_outputs as go
from mmsafe.engine.hooks.safety_report_hook import (GUARDS, SafetyReport,
                                                    SafetyReportHook)
from mmsafe.events import EVENT_ATTR, read_events, write_event
from tests.utils import REPO_ROOT

# function -> (index of the argument that names the output, its kind)
EMITTERS = {'write_event': (1, 'events'), 'update_counters': (0, 'counters'),
            'update_scalar': (1, 'scalars')}
NAMESPACES = ('Event', 'CounterKey', 'Scalar')
# where the emitters are defined and forward the name their caller gives
FORWARDERS = ('mmsafe/events.py', )

# mmsafe's guards, by the name a config (or SafetyReportHook's
# ``sections``) writes
MMSAFE_GUARDS = {
    'NaNSkipOptimWrapper', 'AmpNaNSkipOptimWrapper', 'EmptyBatchSyncHook',
    'DataLoaderProbeHook', 'HangWatchdogHook', 'MACLCheckHook', 'MACLHead',
    'EvalCoverageHook', 'RankFaultHook', 'SafeRunner', 'PreemptionHook',
    'mmsafe.checkpoint.resume', 'ResumePlan', 'FirstBatchStatsHook',
    'ValidInstanceResampleHook', 'LossDictLintHook', 'ScalarBandsHook',
    'SkipAwareParamSchedulerHook', 'mmsafe.datasets.pairing',
    'DivergenceRollbackHook'}
# guards that no registry holds (a module, a class the runner builds)
UNREGISTERED = {'mmsafe.checkpoint.resume', 'mmsafe.datasets.pairing',
                'ResumePlan'}


def _sources():
    root = pathlib.Path(REPO_ROOT)
    for file in sorted((root / 'mmsafe').rglob('*.py')):
        yield file.relative_to(root).as_posix(), file.read_text(
            encoding='utf-8')


def _declarations():
    """kind -> [(name, guard)] over mmsafe's guards (a subclass that
    inherits a declaration is counted once)."""
    found = {'events': [], 'counters': [], 'scalars': []}
    seen = set()
    for guard, emitter in sorted(GUARDS.items()):
        outputs = go.outputs_of(emitter)
        if id(outputs) in seen:
            continue
        seen.add(id(outputs))
        for kind in found:
            found[kind].extend((name, guard)
                               for name in getattr(outputs, kind))
    return found


def _matches(declared: str, name: str) -> bool:
    return declared == name or ('{}' in declared and fnmatch.fnmatchcase(
        name.replace('{}', '*'), declared.replace('{}', '*')))


def static_name(node: ast.AST, bound: dict):
    """The output name ``node`` spells (``{}`` for a part chosen at run
    time), None when it is no static name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return static_name(bound[node.id], {}) if node.id in bound else None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id in NAMESPACES:
        return getattr(getattr(go, node.value.id), node.attr)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == 'format':
        return static_name(node.func.value, bound)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                parts.append(static_name(value.value, bound) or '{}')
            else:
                parts.append(value.value)
        return ''.join(parts)
    return None


def emissions(source: str, path: str):
    """``(line, function, kind, name)`` of every emission in ``source``
    (``name``: the static name, None when there is none);
    ``(line, 'hub.update_scalar', 'scalars', None)`` for a scalar published
    past ``update_scalar``."""
    tree = ast.parse(source, path)
    bound = {t.id: node.value for node in tree.body
             if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in EMITTERS:
            index, kind = EMITTERS[func.id]
            arg = node.args[index] if len(node.args) > index else None
            found.append((node.lineno, func.id, kind,
                          None if arg is None else static_name(arg, bound)))
        elif isinstance(func, ast.Attribute) and \
                func.attr == 'update_scalar':
            found.append((node.lineno, 'hub.update_scalar', 'scalars', None))
    return found


def test_declarations_are_static_and_the_module_is_short():
    text = (pathlib.Path(REPO_ROOT) / 'mmsafe' / 'guard_outputs.py').read_text(
        encoding='utf-8')
    assert len(text.splitlines()) < 150
    tree = ast.parse(text)
    imported = {alias.name for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names} | {
        node.module for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)}
    # no registry is walked, nothing is collected while a run trains
    assert not any('registry' in (name or '') or 'mmengine' in (name or '')
                   for name in imported), imported
    for gone in ('collect', 'owner_of', 'declared_outputs',
                 'UndeclaredOutputError', 'Finding', 'Sync'):
        assert not hasattr(go, gone), gone
    assert go.Event.STEP_SKIP == 'step_skip'
    assert go.CounterKey.STEP_GUARD == 'step_guard'
    assert go.Scalar.GRAD_NORM == 'train/grad_norm'
    with pytest.raises(AttributeError):
        go.Event.lower_case  # noqa: B018


def test_a_run_writes_any_kind_the_suite_checks_the_names(tmp_path):
    # nothing refused at run time: an undeclared name is this test's to find
    write_event(str(tmp_path), 'not_declared_by_any_guard', iter=1)
    assert [r['kind'] for r in read_events(str(tmp_path))] == [
        'not_declared_by_any_guard']


def test_every_emission_in_mmsafe_names_a_declared_output():
    declared = _declarations()
    bad, calls = [], 0
    for path, source in _sources():
        if path in FORWARDERS:
            continue
        for line, func, kind, name in emissions(source, path):
            calls += 1
            if name is None:
                bad.append(f'{path}:{line}: {func} names no static name')
            elif not any(_matches(d, name) for d, _ in declared[kind]):
                bad.append(f'{path}:{line}: {func}({name!r}) is declared '
                           "by no guard (add it to the guard_outputs of "
                           'the guard that emits it)')
    assert calls > 40  # the scan sees the guards
    assert not bad, '\n'.join(bad)


def test_the_scan_catches_a_spelled_out_or_undeclared_output():
    source = ('from mmsafe.guard_outputs import Event\n'
              'KIND = Event.STEP_SKIP\n'
              'def f(runner, hub, name):\n'
              '    write_event(runner.work_dir, KIND)\n'
              "    write_event(runner.work_dir, 'step_skp')\n"
              '    write_event(runner.work_dir, name)\n'
              "    update_counters(f'guard_{name}')\n"
              "    update_scalar(hub, 'train/grad_norm_{}'.format(name))\n"
              "    hub.update_scalar('train/x', 1)\n")
    found = [(kind, name) for _, _, kind, name in emissions(source, 'x.py')]
    assert found == [('events', 'step_skip'), ('events', 'step_skp'),
                     ('events', None), ('counters', 'guard_{}'),
                     ('scalars', 'train/grad_norm_{}'), ('scalars', None)]
    declared = _declarations()
    assert any(_matches(d, 'step_skip') for d, _ in declared['events'])
    assert not any(_matches(d, 'step_skp') for d, _ in declared['events'])
    assert any(_matches(d, 'train/grad_norm_{}')
               for d, _ in declared['scalars'])


def test_every_name_is_declared_by_one_guard_and_emitted():
    emitted = {kind: {name for path, source in _sources()
                      if path not in FORWARDERS
                      for _, _, k, name in emissions(source, path)
                      if k == kind and name}
               for kind in ('events', 'counters', 'scalars')}
    sections = set(go.SECTION_ORDER) | {go.Section.OTHER}
    for emitter in GUARDS.values():
        assert go.outputs_of(emitter).section in sections, emitter
    for kind, pairs in _declarations().items():
        names = [name for name, _ in pairs]
        assert len(names) == len(set(names)), (kind, sorted(names))
        for name, guard in pairs:
            assert any(_matches(name, e) for e in emitted[kind]), (
                f'{guard} declares {kind[:-1]} {name!r}, never emitted')


def _declaring_sites():
    """``(module, class or None)`` of every ``guard_outputs = ...`` in a
    class body or at a module's top level in mmsafe."""
    for path, source in _sources():
        module = path[:-3].replace('/', '.')
        tree = ast.parse(source, path)
        for node in tree.body:
            bodies = [(None, [node])] if not isinstance(node, ast.ClassDef) \
                else [(node.name, node.body)]
            for owner, body in bodies:
                for item in body:
                    if isinstance(item, (ast.Assign, ast.AnnAssign)) and any(
                            isinstance(t, ast.Name)
                            and t.id == 'guard_outputs'
                            for t in getattr(item, 'targets',
                                             [getattr(item, 'target', None)])):
                        yield module, owner


def test_every_declaring_guard_is_listed_under_its_registered_name():
    assert set(GUARDS) == MMSAFE_GUARDS
    listed = {(getattr(e, '__module__', None) or e.__name__,
               e.__name__ if isinstance(e, type) else None)
              for e in GUARDS.values()}
    sites = set(_declaring_sites())
    assert sites, 'the scan finds no declaration'
    assert sites <= listed, sites - listed
    from mmsafe import registry as mmsafe_registry
    registries = [obj for module in (mmdet_registry, mmsafe_registry)
                  for obj in vars(module).values()
                  if isinstance(obj, type(mmdet_registry.HOOKS))]
    for name, emitter in GUARDS.items():
        if name in UNREGISTERED:
            continue
        assert any(r.module_dict.get(name) is emitter
                   for r in registries), name
    # a subclass that inherits the declaration shares it
    assert go.outputs_of(GUARDS['AmpNaNSkipOptimWrapper']) is \
        go.outputs_of(GUARDS['NaNSkipOptimWrapper'])


def test_report_sections_follow_the_declarations():
    report = SafetyReport()
    for kind, pairs in _declarations().items():
        if kind == 'scalars':
            continue
        for name, guard in pairs:
            assert report.section_of(name) == \
                go.outputs_of(GUARDS[guard]).section, name
    assert report.section_of(go.Event.PREEMPTED) == 'preemption'
    assert report.section_of(go.CounterKey.STEP_GUARD) == 'skipped_steps'
    assert report.section_of('from_an_older_run') == 'other'
    moved = SafetyReport(sections=[('bands', ['ScalarBandsHook'])])
    assert moved.section_of(go.Event.BAND_STOP) == 'bands'
    assert moved.section_of(go.CounterKey.SCALAR_BANDS) == 'bands'
    assert moved.section_of(go.Event.STEP_SKIP) == 'skipped_steps'
    for name in ('NaNSkipOptimWrapper', 'AmpNaNSkipOptimWrapper'):
        moved = SafetyReport(sections=[('optimizer', [name])])
        assert moved.section_of(go.Event.STEP_SKIP) == 'optimizer'
        assert moved.section_of(go.CounterKey.STEP_GUARD) == 'optimizer'
        assert moved.section_of(go.Event.BAND_STOP) == 'other'
    with pytest.raises(go.UnknownGuardError) as info:
        SafetyReport(sections=[('optimizer', ['NanSkipOptimWrapper'])])
    message = str(info.value)
    assert "'NanSkipOptimWrapper' is not a registered guard" in message
    for name in MMSAFE_GUARDS:
        assert name in message, name
    with pytest.raises(go.UnknownGuardError, match='SafetyReportHook'):
        # registered, but it declares no outputs
        SafetyReport(sections=[('x', ['SafetyReportHook'])])


class GuardOutputsTestPluginHook(Hook):
    """A plugin's guard: its outputs are declared on its class only."""
    guard_outputs = go.GuardOutputs('my_plugin', events=('my_kind', ),
                                    counters=('my_plugin', ))


def test_a_plugin_guard_of_the_run_lands_in_its_section(tmp_path):
    hub = MessageHub.get_instance('test_guard_outputs_plugin')
    write_event(str(tmp_path), 'my_kind', iter=3)
    runner = SimpleNamespace(work_dir=str(tmp_path), message_hub=hub,
                             hooks=[GuardOutputsTestPluginHook()])
    summary = SafetyReport().build(
        runner, 'finished', None, [SafetyReport.local_state(runner)],
        0.)['summary']
    assert summary['my_plugin']['events'] == 1
    assert summary['other']['events'] == 0
    # moved by the name its class is registered under
    hooks = mmdet_registry.HOOKS
    hooks.register_module(module=GuardOutputsTestPluginHook)
    try:
        hook = SafetyReportHook(
            sections=[('mine', ['GuardOutputsTestPluginHook'])])
        summary = hook.report.build(
            runner, 'finished', None, [SafetyReport.local_state(runner)],
            0.)['summary']
        assert summary['mine']['events'] == 1
    finally:
        hooks.module_dict.pop('GuardOutputsTestPluginHook')


class _Channel:
    """What the rank channel's log handler hands a message to."""

    def __init__(self):
        self.shared = []

    def share(self, kind, message, level, iteration):
        self.shared.append((kind, message, level, iteration))


def test_an_events_message_is_logged_with_its_kind_for_the_channel(tmp_path):
    from mmsafe.engine.rank_channel import _EventForwarder
    logger = MMLogger.get_instance('test_guard_outputs_forward',
                                   log_level='INFO')
    channel = _Channel()
    handler = _EventForwarder(channel)
    logger.addHandler(handler)
    try:
        write_event(str(tmp_path), go.Event.EMPTY_BATCH, 'rank 1: empty',
                    logging.INFO, iter=4)
        write_event(str(tmp_path), go.Event.MACL_PRESENCE_LOCAL, 'missing',
                    iter=5, problem='missing')
        write_event(str(tmp_path), go.Event.STEP_SKIP, iter=6)  # no message
        # message and level are positional: as keywords they are fields
        write_event(str(tmp_path), go.Event.FIRST_BATCH_FLAG, iter=7,
                    message='a field', level='a field too')
        from mmsafe.events import log
        log('a line that is no event')
    finally:
        logger.removeHandler(handler)
    assert channel.shared == [
        ('empty_batch', 'rank 1: empty', logging.INFO, 4),
        ('macl_presence_local/missing', 'missing', logging.WARNING, 5)]
    assert EVENT_ATTR == 'mmsafe_event'
    records = read_events(str(tmp_path))
    assert [r['kind'] for r in records] == [
        'empty_batch', 'macl_presence_local', 'step_skip', 'first_batch_flag']
    assert records[-1]['message'] == 'a field'
    assert records[-1]['level'] == 'a field too'

"""What every guard leaves behind is declared on the guard's own class
(its ``guard_outputs``, mmsafe/guard_outputs.py), collected from MMEngine's
registries by registered type name, and nothing undeclared is emitted.

* no free-string table is left: the declarations live on the classes;
* at run time, ``write_event``/``update_counters``/``update_scalar``/
  ``share_finding`` refuse a name no guard declares, and accept one that a
  class registered since the last collection declares;
* a source scan (AST) of ``mmsafe/``: every call of these, and every name
  a guard declares or posts in the monitor sync, is a constant of the
  namespaces (no string spelled at the call), every such name is declared
  by a guard, every constant is emitted, and no code publishes a scalar
  past ``update_scalar``;
* every name is declared by exactly one guard, whose name is the type name
  it is registered under;
* the safety report files each output under its guard's section, and moves
  a guard named by its registered type name.
"""
import ast
import pathlib

import pytest
from mmengine.hooks import Hook
from mmengine.logging import MessageHub

from mmdet import registry as mmdet_registry
from mmsafe import guard_outputs as go
from mmsafe.engine.hooks.safety_report_hook import SafetyReport
from mmsafe.engine.rank_channel import share_finding
from mmsafe.events import (read_events, update_counters, update_scalar,
                           write_event)
from tests.utils import REPO_ROOT

NAMESPACES = {'events': go.Event, 'counters': go.CounterKey,
              'scalars': go.Scalar, 'findings': go.Finding, 'sync': go.Sync}
# function -> (index of the argument that names the output, its kind)
EMITTERS = {'write_event': (1, 'events'), 'update_counters': (0, 'counters'),
            'update_scalar': (1, 'scalars'),
            'share_finding': (0, 'findings')}
# methods of the monitor sync that name a value
SYNC_METHODS = ('declare', 'post')
# where the emitters are defined or forward the name their caller gives
FORWARDERS = ('mmsafe/events.py', 'mmsafe/guard_outputs.py',
              'mmsafe/engine/run_context.py')

# mmsafe's guards, by the name a config (or SafetyReportHook's
# ``sections``) writes
MMSAFE_GUARDS = {
    'NaNSkipOptimWrapper', 'EmptyBatchSyncHook', 'DataLoaderProbeHook',
    'HangWatchdogHook', 'MACLCheckHook', 'MACLHead', 'EvalCoverageHook',
    'RankFaultHook', 'SafeRunner', 'PreemptionHook',
    'mmsafe.checkpoint.resume', 'ResumePlan', 'FirstBatchStatsHook',
    'ValidInstanceResampleHook', 'LossDictLintHook', 'ScalarBandsHook',
    'SkipAwareParamSchedulerHook', 'mmsafe.datasets.pairing',
    'DivergenceRollbackHook'}


def _constants(namespace):
    return {name: value for name, value in vars(namespace).items()
            if name.isupper() and isinstance(value, str)}


def _sources():
    root = pathlib.Path(REPO_ROOT)
    for file in sorted((root / 'mmsafe').rglob('*.py')):
        yield file.relative_to(root).as_posix(), file.read_text(
            encoding='utf-8')


def _mmsafe_guards(table):
    return [guard for guard in table.guards
            if getattr(guard.emitter, '__module__',
                       guard.emitter.__name__).startswith('mmsafe.')]


def _mmdet_registries():
    """MMDetection's registries and mmsafe's scope (where the detection
    stack is registered)."""
    from mmsafe import registry as mmsafe_registry
    return [obj for module in (mmdet_registry, mmsafe_registry)
            for obj in vars(module).values()
            if isinstance(obj, type(mmdet_registry.HOOKS))]


def test_no_free_string_table_is_left():
    assert not hasattr(go, 'GUARD_OUTPUTS')
    assert not hasattr(go, 'declare_guard')
    # a declaration names no guard: the class that holds it is the guard
    assert 'guard' not in go.GuardOutputs.__dataclass_fields__


def test_undeclared_outputs_are_refused(tmp_path):
    hub = MessageHub.get_instance('test_guard_outputs')
    with pytest.raises(go.UndeclaredOutputError, match="'not_a_kind'"):
        write_event(str(tmp_path), 'not_a_kind', iter=1)
    with pytest.raises(go.UndeclaredOutputError, match='guard_outputs'):
        update_counters('not_a_guard', count=1)
    with pytest.raises(go.UndeclaredOutputError):
        update_scalar(hub, 'train/not_a_scalar', 1.0)
    with pytest.raises(go.UndeclaredOutputError):
        share_finding('not_a_finding', 'message')
    assert read_events(str(tmp_path)) == []
    # declared ones pass, patterns included
    write_event(str(tmp_path), go.Event.STEP_SKIP, iter=1)
    update_scalar(hub, go.Scalar.GRAD_NORM_OF_RULE.format('backbone.*'), 2.)
    share_finding(go.Finding.MACL_PROBLEM.format('missing'), 'message')
    assert [r['kind'] for r in read_events(str(tmp_path))] == ['step_skip']
    assert hub.get_scalar('train/grad_norm_backbone.*').current() == 2.


def test_a_declared_name_is_checked_without_walking_the_registries():
    table = go.declared_outputs()
    for _ in range(3):
        assert go.owner_of('events', go.Event.STEP_SKIP).name == \
            'NaNSkipOptimWrapper'
        assert go.owner_of('scalars', 'train/grad_norm_neck').name == \
            'NaNSkipOptimWrapper'
    assert go.declared_outputs() is table


def _constant_of(node: ast.AST, bound: dict):
    """``'Event.X'`` when ``node`` is built from a namespace constant:
    ``Event.X``, ``Scalar.X.format(...)``, or a name the module binds to
    one of these; None otherwise."""
    if isinstance(node, ast.Name):
        return _constant_of(bound[node.id], {}) if node.id in bound \
            else None
    if isinstance(node, ast.Call):
        return _constant_of(node.func, bound)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in (
                'Event', 'CounterKey', 'Scalar', 'Finding', 'Sync'):
            return f'{node.value.id}.{node.attr}'
        return _constant_of(node.value, bound)
    return None


def emissions(source: str, path: str):
    """``(line, function, kind, constant)`` of every call of an emitter and
    of a monitor sync's ``declare``/``post`` in ``source`` (``constant``:
    the ``'Event.X'`` that names the output, None when it is no constant);
    ``(line, 'hub.update_scalar', 'scalars', None)`` for a scalar
    published past ``update_scalar``."""
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
                          None if arg is None else _constant_of(arg, bound)))
        elif isinstance(func, ast.Attribute) and func.attr == 'write' \
                and ast.unparse(func.value).endswith('events'):
            # the run context's event sink (mmsafe.engine.run_context)
            arg = node.args[0] if node.args else None
            found.append((node.lineno, 'events.write', 'events',
                          None if arg is None else _constant_of(arg, bound)))
        elif isinstance(func, ast.Attribute) and \
                func.attr == 'update_scalar':
            found.append((node.lineno, 'hub.update_scalar', 'scalars', None))
        elif isinstance(func, ast.Attribute) and \
                func.attr in SYNC_METHODS and \
                ast.unparse(func.value).endswith('sync'):
            found.append((node.lineno, f'sync.{func.attr}', 'sync',
                          _constant_of(node.args[0], bound)
                          if node.args else None))
    return found


def _value(constant: str) -> str:
    namespace, name = constant.split('.')
    return getattr(getattr(go, namespace), name)


def test_every_emission_in_mmsafe_names_a_declared_constant():
    table = go.collect()
    bad, calls = [], 0
    for path, source in _sources():
        if path in FORWARDERS:
            continue
        for line, func, kind, constant in emissions(source, path):
            calls += 1
            if constant is None:
                bad.append(f'{path}:{line}: {func} names no constant')
            elif table.owner(kind, _value(constant)) is None:
                bad.append(f'{path}:{line}: {func}({constant}) is declared '
                           'by no guard')
    assert calls > 40  # the scan sees the guards
    assert not bad, ('outputs not named by a declared constant of '
                     'mmsafe.guard_outputs:\n' + '\n'.join(bad))


def test_the_scan_catches_a_spelled_out_or_undeclared_output():
    source = ('from mmsafe.guard_outputs import Event\n'
              'KIND = Event.STEP_SKIP\n'
              'OTHER = "step_skip"\n'
              'def f(runner, hub):\n'
              '    write_event(runner.work_dir, KIND)\n'
              '    write_event(runner.work_dir, Event.STEP_SKIP)\n'
              "    write_event(runner.work_dir, 'step_skip')\n"
              '    write_event(runner.work_dir, OTHER)\n'
              "    update_counters(f'guard_{1}')\n"
              "    hub.update_scalar('train/x', 1)\n"
              "    self._sync.post(Sync.MACL_CHECK.format('seen'), 1.0)\n"
              "    runner.monitor_sync.declare('my/value')\n")
    assert [(kind, constant)
            for _, _, kind, constant in emissions(source, 'x.py')] == [
        ('events', 'Event.STEP_SKIP'), ('events', 'Event.STEP_SKIP'),
        ('events', None), ('events', None), ('counters', None),
        ('scalars', None), ('sync', 'Sync.MACL_CHECK'), ('sync', None)]
    table = go.collect()
    assert table.owner('events', _value('Event.STEP_SKIP')) is not None
    assert table.owner('events', 'not_declared') is None


def test_the_scan_sees_the_run_contexts_event_sink():
    source = ('def f(runner, context, file):\n'
              '    run_context(runner).events.write(Event.RANK_FAILED)\n'
              "    context.events.write('rank_failed', rank=1)\n"
              "    file.write('not an event')\n")
    assert [(func, kind, constant)
            for _, func, kind, constant in emissions(source, 'x.py')] == [
        ('events.write', 'events', 'Event.RANK_FAILED'),
        ('events.write', 'events', None)]


def test_every_constant_is_declared_by_one_guard_and_emitted():
    table = go.collect()
    guards = _mmsafe_guards(table)
    emitted = {constant for path, source in _sources()
               if path not in FORWARDERS
               for _, _, _, constant in emissions(source, path)}
    sections = set(go.SECTION_ORDER) | {go.Section.OTHER}
    for guard in guards:
        assert guard.outputs.section in sections, guard
    for kind, namespace in NAMESPACES.items():
        declared = [name for guard in guards
                    for name in getattr(guard.outputs, kind)]
        assert len(declared) == len(set(declared)), kind  # by one guard
        constants = _constants(namespace)
        assert sorted(set(constants.values())) == sorted(declared), kind
        for name in constants:
            assert f'{namespace.__name__}.{name}' in emitted, (
                f'{namespace.__name__}.{name} is declared but never emitted')


def test_each_guard_is_the_class_registered_under_its_name():
    table = go.collect()
    guards = {guard.name: guard for guard in _mmsafe_guards(table)}
    assert set(guards) == MMSAFE_GUARDS
    registries = _mmdet_registries()
    for name, guard in guards.items():
        # the declaration is the class's (module's) own, not inherited
        assert vars(guard.emitter)[go.OUTPUTS_ATTR] is guard.outputs
        registered = [r for r in registries
                      if r.module_dict.get(name) is guard.emitter]
        if isinstance(guard.emitter, type):
            path = f'{guard.emitter.__module__}:{guard.emitter.__name__}'
        else:
            path = guard.emitter.__name__
        assert registered or path in go.UNREGISTERED_EMITTERS, name
    # a registered subclass that inherits the declaration is named by its
    # own registered name too, and is the same guard
    amp = table.guard('AmpNaNSkipOptimWrapper')
    assert amp is table.guard('NaNSkipOptimWrapper')
    assert 'AmpNaNSkipOptimWrapper' in amp.aliases


def test_report_sections_follow_the_declarations():
    table = go.collect()
    report = SafetyReport()
    for kind in ('events', 'counters'):
        for guard in table.guards:
            for name in getattr(guard.outputs, kind):
                assert report.section_of(name) == guard.outputs.section, name
    assert report.section_of(go.Event.PREEMPTED) == 'preemption'
    assert report.section_of(go.CounterKey.STEP_GUARD) == 'skipped_steps'
    assert report.section_of('from_an_older_run') == 'other'
    moved = SafetyReport(sections=[('bands', ['ScalarBandsHook'])])
    assert moved.section_of(go.Event.BAND_STOP) == 'bands'
    assert moved.section_of(go.CounterKey.SCALAR_BANDS) == 'bands'
    assert moved.section_of(go.Event.STEP_SKIP) == 'skipped_steps'
    # the optimizer wrapper by the type name a config writes, or by that of
    # its AMP subclass
    for name in ('NaNSkipOptimWrapper', 'AmpNaNSkipOptimWrapper'):
        moved = SafetyReport(sections=[('optimizer', [name])])
        assert moved.section_of(go.Event.STEP_SKIP) == 'optimizer'
        assert moved.section_of(go.CounterKey.STEP_GUARD) == 'optimizer'
        assert moved.section_of(go.Event.BAND_STOP) == 'other'
    # a name no registered guard answers to is refused, with the names
    with pytest.raises(go.UnknownGuardError) as info:
        SafetyReport(sections=[('optimizer', ['NanSkipOptimWrapper'])])
    message = str(info.value)
    assert "'NanSkipOptimWrapper' is not a registered guard" in message
    for name in MMSAFE_GUARDS | {'AmpNaNSkipOptimWrapper'}:
        assert name in message, name
    with pytest.raises(go.UnknownGuardError, match='SafetyReportHook'):
        # registered, but it declares no outputs
        SafetyReport(sections=[('x', ['SafetyReportHook'])])


class GuardOutputsTestPluginHook(Hook):
    """A plugin's guard: its outputs are declared on its class only."""
    guard_outputs = go.GuardOutputs('my_plugin', events=('my_kind', ),
                                    counters=('my_plugin', ),
                                    scalars=('train/my_plugin_{}', ))


class GuardOutputsTestRivalHook(Hook):
    """Another plugin's guard that declares a name the first one does."""
    guard_outputs = go.GuardOutputs('rival', events=('my_kind', ))


def test_a_plugin_guard_declares_its_outputs_on_its_class(tmp_path):
    hooks = mmdet_registry.HOOKS
    hub = MessageHub.get_instance('test_guard_outputs_plugin')
    go.declared_outputs()  # a table collected before the plugin registers
    with pytest.raises(go.UndeclaredOutputError):
        write_event(str(tmp_path), 'my_kind')
    hooks.register_module(module=GuardOutputsTestPluginHook)
    try:
        # no other call: the class registered is found on first use
        write_event(str(tmp_path), 'my_kind', iter=3)
        update_counters('my_plugin', seen=1)
        update_scalar(hub, 'train/my_plugin_loss', 1.0)
        assert SafetyReport().section_of('my_kind') == 'my_plugin'
        moved = SafetyReport(
            sections=[('mine', ['GuardOutputsTestPluginHook'])])
        assert moved.section_of('my_kind') == 'mine'
        assert moved.section_of('my_plugin') == 'mine'
        # a name is declared by one guard only
        hooks.register_module(module=GuardOutputsTestRivalHook)
        try:
            with pytest.raises(ValueError, match='GuardOutputsTestPluginHook'
                               r'.*and by GuardOutputsTestRivalHook'):
                go.collect()
        finally:
            hooks.module_dict.pop('GuardOutputsTestRivalHook')
    finally:
        hooks.module_dict.pop('GuardOutputsTestPluginHook')
        go.collect()
    assert read_events(str(tmp_path), 'my_kind')[0]['iter'] == 3
    with pytest.raises(go.UndeclaredOutputError):
        write_event(str(tmp_path), 'my_kind')

"""The table of guard outputs (mmsafe/guard_outputs.py) is the one place
where event kinds, counter keys, scalars and rank-channel findings are
named, and nothing outside it is emitted.

* at run time, ``write_event``/``update_counters``/``update_scalar``/
  ``share_finding`` refuse a name the table does not declare;
* a source scan (AST) of ``mmsafe/``: every call of these, and every name
  a guard declares or posts in the monitor sync, is a constant of the
  table (no string spelled at the call), and no code publishes a scalar
  past ``update_scalar``;
* every constant is declared by exactly one guard, and used;
* the safety report files each output under its guard's section.
"""
import ast
import pathlib

import pytest
from mmengine.logging import MessageHub

from mmsafe import guard_outputs as go
from mmsafe.engine.hooks.safety_report_hook import SafetyReport
from mmsafe.engine.rank_channel import share_finding
from mmsafe.events import (read_events, update_counters, update_scalar,
                           write_event)
from tests.utils import REPO_ROOT

NAMESPACES = {'events': go.Event, 'counters': go.Counter,
              'scalars': go.Scalar, 'findings': go.Finding, 'sync': go.Sync}
# function -> index of the argument that names the output
EMITTERS = {'write_event': 1, 'update_counters': 0, 'update_scalar': 1,
            'share_finding': 0}
# methods of the monitor sync that name a value
SYNC_METHODS = ('declare', 'post')


def _constants(namespace):
    return {name: value for name, value in vars(namespace).items()
            if name.isupper() and isinstance(value, str)}


def _sources():
    root = pathlib.Path(REPO_ROOT)
    for file in sorted((root / 'mmsafe').rglob('*.py')):
        yield file.relative_to(root).as_posix(), file.read_text(
            encoding='utf-8')


def test_undeclared_outputs_are_refused(tmp_path):
    hub = MessageHub.get_instance('test_guard_outputs')
    with pytest.raises(go.UndeclaredOutputError, match="'not_a_kind'"):
        write_event(str(tmp_path), 'not_a_kind', iter=1)
    with pytest.raises(go.UndeclaredOutputError, match='declare_guard'):
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


def _names_a_constant(node: ast.AST, bound: dict) -> bool:
    """Whether ``node`` is built from a table constant: ``Event.X``,
    ``Scalar.X.format(...)``, or a name the
    module binds to one of these."""
    if isinstance(node, ast.Name):
        return node.id in bound and _names_a_constant(bound[node.id], {})
    if isinstance(node, ast.Call):
        return _names_a_constant(node.func, bound)
    if isinstance(node, ast.Attribute):
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        return isinstance(root, ast.Name) and root.id in (
            'Event', 'Counter', 'Scalar', 'Finding', 'Sync')
    return False


def emissions(source: str, path: str):
    """``(line, function, argument is a table constant)`` of every call of
    an emitter and of a monitor sync's ``declare``/``post`` in ``source``;
    ``(line, 'hub.update_scalar', False)`` for a scalar published past
    ``update_scalar``."""
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
            index = EMITTERS[func.id]
            arg = node.args[index] if len(node.args) > index else None
            found.append((node.lineno, func.id,
                          arg is not None and _names_a_constant(arg, bound)))
        elif isinstance(func, ast.Attribute) and \
                func.attr == 'update_scalar':
            found.append((node.lineno, 'hub.update_scalar', False))
        elif isinstance(func, ast.Attribute) and \
                func.attr in SYNC_METHODS and \
                ast.unparse(func.value).endswith('sync'):
            found.append((node.lineno, f'sync.{func.attr}', bool(
                node.args) and _names_a_constant(node.args[0], bound)))
    return found


def test_every_emission_in_mmsafe_names_a_table_constant():
    bad, calls = [], 0
    for path, source in _sources():
        if path in ('mmsafe/events.py', 'mmsafe/guard_outputs.py'):
            continue
        for line, func, ok in emissions(source, path):
            calls += 1
            if not ok:
                bad.append(f'{path}:{line}: {func}')
    assert calls > 40  # the scan sees the guards
    assert not bad, ('outputs not named by a constant of '
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
    assert [ok for _, _, ok in emissions(source, 'x.py')] == [
        True, True, False, False, False, False, True, False]


def test_every_constant_is_declared_by_one_guard_and_used():
    sources = '\n'.join(s for p, s in _sources()
                        if p != 'mmsafe/guard_outputs.py')
    guards = [entry.guard for entry in go.GUARD_OUTPUTS]
    assert len(guards) == len(set(guards))
    sections = set(go.SECTION_ORDER) | {go.Section.OTHER}
    for entry in go.GUARD_OUTPUTS:
        assert entry.section in sections, entry
    for kind, namespace in NAMESPACES.items():
        declared = list(go.declared(kind))
        assert len(declared) == len(set(declared)), kind
        constants = _constants(namespace)
        assert sorted(set(constants.values())) == sorted(declared), kind
        for name in constants:
            assert f'{namespace.__name__}.{name}' in sources, (
                f'{namespace.__name__}.{name} is declared but never emitted')


def test_report_sections_follow_the_table():
    report = SafetyReport()
    for kind in ('events', 'counters'):
        for entry in go.GUARD_OUTPUTS:
            for name in getattr(entry, kind):
                assert report.section_of(name) == entry.section, name
    assert report.section_of(go.Event.PREEMPTED) == 'preemption'
    assert report.section_of(go.Counter.STEP_GUARD) == 'skipped_steps'
    assert report.section_of('from_an_older_run') == 'other'
    moved = SafetyReport(sections=[('bands', ['ScalarBandsHook'])])
    assert moved.section_of(go.Event.BAND_STOP) == 'bands'
    assert moved.section_of(go.Counter.SCALAR_BANDS) == 'bands'
    assert moved.section_of(go.Event.STEP_SKIP) == 'skipped_steps'


def test_a_plugin_declares_the_outputs_of_its_guard(tmp_path):
    entry = go.GuardOutputs('MyPluginHook', 'my_plugin', events=('my_kind', ),
                            counters=('my_plugin', ))
    with pytest.raises(go.UndeclaredOutputError):
        write_event(str(tmp_path), 'my_kind')
    go.declare_guard(entry)
    try:
        go.declare_guard(entry)  # again: no-op
        write_event(str(tmp_path), 'my_kind', iter=3)
        update_counters('my_plugin', seen=1)
        assert SafetyReport().section_of('my_kind') == 'my_plugin'
        with pytest.raises(ValueError, match='declared by MyPluginHook'):
            go.declare_guard(go.GuardOutputs('Other', 'x',
                                             events=('my_kind', )))
    finally:
        go.GUARD_OUTPUTS.remove(entry)
    assert read_events(str(tmp_path), 'my_kind')[0]['iter'] == 3

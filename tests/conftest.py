"""Suite-wide set-up: the worktree's mmsafe first on sys.path, temporary
files under one folder removed at the end, process groups killed after
every test (pytest-timeout included), and the ``slow`` marker.

- ``tempfile`` (in this process and, through ``TMPDIR``, in every process
  the tests start) writes under one session folder, removed when the session
  ends, so ``tempfile.mkdtemp()`` leaves nothing behind. Set
  ``MMSAFE_KEEP_TEST_TMP=1`` to keep it for a post-mortem. Paths stay
  short (``<session>/t`` as pytest's base folder, ``tmp_path`` folders
  ``t0``, ``t1`` ...): see :func:`pytest_configure`.
- After each test, the process groups that ``tests.utils`` started and did
  not end yet are killed; at the end of the session, any process the suite
  left behind is killed too.
- Each test gets a deadline ``TIMEOUT_MARGIN`` seconds (a tenth of it for
  short ones) before its pytest-timeout; ``tests.utils.run_command`` cuts
  its timeouts to it.
- ``slow`` (registered in setup.cfg) marks tests that start processes or
  train (``tools/train.py``, 2-process gloo, DataLoader workers, other
  subprocesses): see
  :func:`spawns_processes`. ``make test-fast`` deselects them, and a test
  that starts a process through ``tests.utils`` under ``-m "not slow"``
  fails, saying it needs the marker.
- Under pytest-xdist (``make test``: ``-n 2 --dist loadfile``), the test
  files are handed out slowest first: see :func:`_slowest_files_first`.
  Runs shared by several files go through
  ``tests.utils.run_once_per_session``, so they happen once per session.
"""
import ast
import inspect
import os
import shutil
import sys
import tempfile
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault('OMP_NUM_THREADS', '1')

from tests import utils  # noqa: E402

_SESSION_TMP = None


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path factory
def pytest_configure(config):
    global _SESSION_TMP
    if _SESSION_TMP is None and not hasattr(config, 'workerinput'):
        _SESSION_TMP = tempfile.mkdtemp(prefix='mmsafe-')
        tempfile.tempdir = _SESSION_TMP
        os.environ['TMPDIR'] = _SESSION_TMP
        if config.option.basetemp is None:
            # Short paths: a config whose path strings make a line longer
            # than yapf's limit costs seconds in every Config.pretty_text
            # (the Runner's config log and dump, each checkpoint) instead
            # of 0.2 s.
            config.option.basetemp = os.path.join(_SESSION_TMP, 't')
    if not _selects_slow(config):
        utils.set_fast_mode(
            'this test starts a process but is not marked slow, and '
            '-m "not slow" (make test-fast) runs only in-process tests: add '
            '@pytest.mark.slow or call a helper that conftest.py recognises')


@pytest.fixture
def tmp_path(tmp_path_factory):
    """A new folder per test, like pytest's ``tmp_path``, with a short
    name (``t0``, ``t1`` ... instead of the test's name): with the short
    base folder, the paths the tests write into configs stay short (see
    :func:`pytest_configure`)."""
    return tmp_path_factory.mktemp('t')


def _selects_slow(config) -> bool:
    """False when the marker expression deselects ``slow`` tests."""
    expr = (config.option.markexpr or '').replace(' ', '')
    return 'notslow' not in expr


def pytest_unconfigure(config):
    utils.kill_live_groups()
    _kill_leftover_children()
    if _SESSION_TMP and os.environ.get('MMSAFE_KEEP_TEST_TMP') != '1':
        shutil.rmtree(_SESSION_TMP, ignore_errors=True)


def _kill_leftover_children() -> None:
    try:
        import psutil
    except ImportError:
        return
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


def _test_timeout(item) -> float:
    marker = item.get_closest_marker('timeout')
    if marker is not None and marker.args:
        return float(marker.args[0])
    if marker is not None and 'timeout' in marker.kwargs:
        return float(marker.kwargs['timeout'])
    value = item.config.getoption('timeout', None)
    if value is None:
        value = item.config.getini('timeout') or 0
    return float(value or 0)


@pytest.fixture(autouse=True)
def _process_groups_and_deadline(request):
    """Deadline for ``tests.utils`` runs; kill leftover process groups."""
    timeout = _test_timeout(request.node)
    if timeout > 0:
        utils.set_test_deadline(time.monotonic() + timeout - min(
            utils.TIMEOUT_MARGIN, timeout / 10))
    try:
        yield
    finally:
        utils.set_test_deadline(None)
        utils.kill_live_groups()


# --- the slow marker -------------------------------------------------------

# Names whose call (or import into a test module) starts processes.
SPAWNING_NAMES = {
    'run_train', 'run_command', 'spawn', 'Popen', 'check_output', 'run',
    'spawn_processes', 'start_processes', 'WineCmd'}
SPAWNING_MODULES = {'subprocess', 'multiprocessing', 'torch.multiprocessing'}


def _source_tree(obj):
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError, SyntaxError):
        return None


def _spawns_directly(tree) -> bool:
    """A call to a spawning helper, or DataLoader workers (num_workers > 0)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(
                func, 'id', None)
            if name in SPAWNING_NAMES and name != 'run':
                return True
            if (name == 'run' and isinstance(func, ast.Attribute)
                    and getattr(func.value, 'id', '') == 'subprocess'):
                return True
        if isinstance(node, ast.keyword) and node.arg == 'num_workers':
            if not (isinstance(node.value, ast.Constant)
                    and node.value.value == 0):
                return True
    return False


def _called_names(tree):
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            if isinstance(node.value, ast.Name):
                names.add(node.value.id)
    return names


_MODULE_CACHE = {}


def _slow_names(module):
    """Names in ``module`` (functions, fixtures, imported helper modules)
    that start processes, directly or through each other."""
    if module in _MODULE_CACHE:
        return _MODULE_CACHE[module]
    slow, calls = set(), {}
    _MODULE_CACHE[module] = slow  # cycles between test helper modules
    for name, value in vars(module).items():
        if inspect.ismodule(value):
            if (value.__name__ in SPAWNING_MODULES
                    or (value.__name__.startswith('tests.')
                        and value.__name__ != 'tests.utils'
                        and _module_spawns(value))):
                slow.add(name)
            continue
        func = getattr(value, '__wrapped__', value)
        func = getattr(func, '_get_wrapped_function', lambda: func)()
        if not (inspect.isfunction(func) or inspect.isclass(func)):
            continue
        home = getattr(func, '__module__', None)
        if home != module.__name__:
            if name in SPAWNING_NAMES:
                slow.add(name)
            elif (home or '').startswith('tests.') and home in sys.modules \
                    and func.__name__ in _slow_names(sys.modules[home]):
                slow.add(name)
            continue
        tree = _source_tree(func)
        if tree is None:
            continue
        if _spawns_directly(tree):
            slow.add(name)
        calls[name] = _called_names(tree)
    changed = True
    while changed:
        changed = False
        for name, used in calls.items():
            if name not in slow and used & slow:
                slow.add(name)
                changed = True
    return slow


def _module_spawns(module) -> bool:
    tree = _source_tree(module)
    return tree is not None and _spawns_directly(tree)


def spawns_processes(item) -> bool:
    """Whether ``item``'s test function, its fixtures or the module helpers
    they use start processes (see ``SPAWNING_NAMES``)."""
    module = item.module
    slow = _slow_names(module)
    function = getattr(item, 'function', None)
    tree = _source_tree(function) if function is not None else None
    if tree is not None and (_spawns_directly(tree)
                             or _called_names(tree) & slow):
        return True
    for name in getattr(item, 'fixturenames', ()):
        for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
            fmod = sys.modules.get(fixturedef.func.__module__)
            ftree = _source_tree(fixturedef.func)
            if ftree is None:
                continue
            fslow = _slow_names(fmod) if fmod is not None else set()
            if _spawns_directly(ftree) or _called_names(ftree) & fslow:
                return True
    return False


# --- pytest-xdist (make test: -n 2 --dist loadfile) -------------------------


def _slowest_files_first(items) -> None:
    """Order the test files by their number of ``slow`` tests, most first
    (stable otherwise). Under ``--dist loadfile --no-loadscope-reorder``
    the training files then start early and the fast in-process files fill
    the end, so both workers finish at about the same time."""
    def file_of(item):
        return item.nodeid.split('::', 1)[0]
    slow, first = {}, {}
    for index, item in enumerate(items):
        name = file_of(item)
        first.setdefault(name, index)
        slow[name] = slow.get(name, 0) + (
            item.get_closest_marker('slow') is not None)
    items.sort(key=lambda item: (-slow[file_of(item)], first[file_of(item)]))


#: set by ``make test-oldest``: the end that runs the ``one_end`` tests
ONE_END = os.environ.get('MMSAFE_TESTS_AT_ONE_END', '')


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker('slow') is None and spawns_processes(item):
            item.add_marker(pytest.mark.slow)
        if ONE_END and item.get_closest_marker('one_end') is not None:
            item.add_marker(pytest.mark.skip(
                reason=f'does not depend on the torch/MMEngine/MMDetection '
                f'release: run at the {ONE_END} end (one_end)'))
    if hasattr(config, 'workerinput'):  # a pytest-xdist worker
        _slowest_files_first(items)

"""No mmsafe component reads a private attribute of another component.

A source scan (AST) of ``mmsafe/``: every ``obj._name`` (and
``getattr``/``hasattr``/``setattr`` of ``obj, '_name'``) whose ``obj`` is not
``self``, ``cls`` or ``super()``. What one mmsafe component needs from
another is a public, documented attribute or method (e.g.
``NaNSkipOptimWrapper.accumulation_window``,
``PairedDetDataPreprocessor.modality_bgr_to_rgb``).

The reads listed in :data:`THIRD_PARTY` reach into the internals of
PyTorch, MMEngine, MMDetection or the standard library where these offer
no public way; each is listed with why. A new private read fails this test
until it is made public (an mmsafe component) or listed here with its
reason (another library's internals); an entry no longer found fails it
too, so the list stays true.

SafeRunner reads its own base class's state through ``self``, which the
scan above does not see. The package of SafeRunner and the modules it
delegates to (``mmsafe/engine/runner/``) is scanned for every use of a
private name of MMEngine's ``Runner`` (an attribute read through any
receiver, ``self`` and ``super()`` included, or an override): each must be
listed in ``mmsafe.engine.runner.safe_runner.MMENGINE_PRIVATE`` with why
no public attribute or extension point serves, and each listed name must
still be used.
"""
import ast
import inspect
import pathlib
import textwrap

from tests.utils import REPO_ROOT

# (file, receiver as written, attribute): why.
THIRD_PARTY = {
    ('mmsafe/checkpoint/remote_weights.py', 'mm_ckpt', '_get_mmengine_home'):
        "MMEngine's own cache directory for downloaded weights",
    ('mmsafe/checkpoint/history_buffer.py', 'HistoryBuffer',
     '_statistics_methods'):
        "the statistics MMEngine's HistoryBuffer pickles by name (read only)",
    ('mmsafe/compat/torch_features.py', 'multiarray', '_reconstruct'):
        'the NumPy function that pickled arrays name',
    ('mmsafe/compat/torch_features.py', 'numeric', '_frombuffer'):
        'the NumPy function that arrays pickled by protocol 5 name',
    ('mmsafe/compat/cpu_grad_scaler.py', 'module',
     '_refresh_per_optimizer_state'):
        "torch's GradScaler per-optimizer state factory (feature-detected)",
    ('mmsafe/compat/cpu_grad_scaler.py', 'grad', '_values'):
        "the values of a sparse gradient (torch's own GradScaler reads them)",
    ('mmsafe/compat/torch_features.py', 'distributed_c10d',
     '_get_default_store'):
        "the process group's rendezvous store (feature-detected)",
    ('mmsafe/compat/torch_features.py', 'model', '_check_reducer_finalized'):
        "DDP's local reducer check (feature-detected)",
    ('mmsafe/datasets/loader/pickling.py', 'ForkingPickler',
     '_extra_reducers'):
        "multiprocessing's reducer table, read to explain pickling errors",
    ('mmsafe/datasets/loader/probe.py', 'probe', '_iterator'):
        "a DataLoader's persistent worker iterator",
    ('mmsafe/datasets/loader/probe.py', 'it', '_timeout'):
        "a DataLoader iterator's worker timeout",
    ('mmsafe/datasets/loader/probe.py', 'it', '_workers'):
        "a DataLoader iterator's worker processes",
    ('mmsafe/datasets/loader/processes.py', 'loader', '_iterator'):
        "a DataLoader's persistent worker iterator",
    ('mmsafe/datasets/loader/processes.py', 'it', '_workers'):
        "a DataLoader iterator's worker processes",
    ('mmsafe/datasets/loader/processes.py', 'it', '_worker_pids_set'):
        "whether torch registered the workers' pids for SIGCHLD",
    ('mmsafe/datasets/loader/processes.py', 'it', '_shutdown_workers'):
        "torch's own shutdown of a DataLoader iterator's workers",
    ('mmsafe/datasets/loader/processes.py', '_utils.signal_handling',
     '_remove_worker_pids'):
        "torch's SIGCHLD registry of worker pids",
    ('mmsafe/datasets/loader/processes.py', 'os', '_exit'):
        'public API of the standard library',
    ('mmsafe/datasets/walk.py', 'current', '_get_ori_dataset_idx'):
        "MMEngine's ConcatDataset index mapping",
    ('mmsafe/engine/hooks/first_batch_checks.py', 'pre',
     '_channel_conversion'):
        "MMEngine/MMDetection preprocessors' channel swap setting",
    ('mmsafe/engine/hooks/hang_watchdog_hook.py', 'os', '_exit'):
        'public API of the standard library',
    ('mmsafe/engine/hooks/hang_watchdog_hook.py', 'sys',
     '_current_frames'):
        'public API of the standard library',
    ('mmsafe/engine/hooks/macl_signals.py', 'p', '_version'):
        "a tensor's in-place version counter",
    ('mmsafe/engine/loops.py', 'infinite', '_iterator'):
        'the DataLoader iterator inside MMEngine\'s '
        '_InfiniteDataloaderIterator',
    ('mmsafe/engine/optimizers/amp_nan_skip_optim_wrapper.py',
     'self.loss_scaler', '_per_optimizer_states'):
        "GradScaler's per-optimizer state (found-inf flags)",
    ('mmsafe/engine/optimizers/amp_nan_skip_optim_wrapper.py',
     'self.loss_scaler', '_scale'):
        "GradScaler's scale tensor, read without a device sync",
    ('mmsafe/engine/rank_channel.py', 'os', '_exit'):
        'public API of the standard library',
    ('mmsafe/engine/utils.py', 'runner', '_train_loop'):
        "MMEngine's train loop without building it (the runner's property "
        'builds a loop from its config)',
    ('mmsafe/errors.py', 'MMLogger', '_instance_dict'):
        "MMEngine's logger instances",
    ('mmsafe/preflight/context.py', 'base', '_search_child'):
        "MMEngine's registry lookup in child scopes",
}

_FUNCS = ('getattr', 'hasattr', 'setattr')


def _is_private(name) -> bool:
    return isinstance(name, str) and name.startswith('_') and \
        not name.startswith('__')


def _own(receiver: ast.AST) -> bool:
    if isinstance(receiver, ast.Name) and receiver.id in ('self', 'cls'):
        return True
    return isinstance(receiver, ast.Call) and isinstance(
        receiver.func, ast.Name) and receiver.func.id == 'super'


def private_reads(source: str, path: str):
    """``(path, receiver, attribute, line)`` of every private attribute
    that the code at ``path`` reads from an object other than its own."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            receiver, name = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in _FUNCS and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)
              and _is_private(node.args[1].value)):
            receiver, name = node.args[0], node.args[1].value
        else:
            continue
        if not _own(receiver):
            found.append((path, ast.unparse(receiver), name, node.lineno))
    return found


def _scan():
    found = []
    root = pathlib.Path(REPO_ROOT)
    for file in sorted((root / 'mmsafe').rglob('*.py')):
        path = file.relative_to(root).as_posix()
        found += private_reads(file.read_text(encoding='utf-8'), path)
    return found


def test_no_component_reads_another_components_private_state():
    unexplained = [f'{path}:{line}: {receiver}.{name}'
                   for path, receiver, name, line in _scan()
                   if (path, receiver, name) not in THIRD_PARTY]
    assert not unexplained, (
        'private attributes read from other objects (make what is needed a '
        "public attribute or method; another library's internals go in "
        'THIRD_PARTY with why):\n' + '\n'.join(unexplained))


def test_every_listed_third_party_read_still_exists():
    found = {(path, receiver, name) for path, receiver, name, _ in _scan()}
    assert not set(THIRD_PARTY) - found, sorted(set(THIRD_PARTY) - found)


def test_the_scan_finds_reads_through_attributes_and_getattr():
    source = ('def f(self, hook, wrapper):\n'
              '    self._mine = hook._state\n'
              "    return getattr(wrapper, '_accumulative_counts', 1), "
              'super()._x, self._y\n')
    assert [(r, n) for _, r, n, _ in private_reads(source, 'x.py')] == [
        ('hook', '_state'), ('wrapper', '_accumulative_counts')]


RUNNER_PACKAGE = 'mmsafe/engine/runner'


def mmengine_runner_private_names() -> set:
    """The private names of MMEngine's ``Runner``: its private methods and
    every ``self._x`` its source uses."""
    from mmengine.runner import Runner
    tree = ast.parse(textwrap.dedent(inspect.getsource(Runner)))
    names = {node.attr for node in ast.walk(tree)
             if isinstance(node, ast.Attribute)
             and isinstance(node.value, ast.Name) and node.value.id == 'self'
             and _is_private(node.attr)}
    return names | {name for name in vars(Runner) if _is_private(name)}


def runner_internals_used(source: str, path: str, names: set):
    """``(name, line)`` of every use of one of ``names`` in ``source``: an
    attribute through any receiver (``self``, ``super()``, a runner), a
    ``getattr``/``hasattr``/``setattr`` of it, or a method of that name
    (an override)."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.append((node.attr, node.lineno))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in _FUNCS and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in names):
            found.append((node.args[1].value, node.lineno))
        elif (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
              and node.name in names):
            found.append((node.name, node.lineno))
    return found


def _runner_scan():
    names = mmengine_runner_private_names()
    found = {}
    root = pathlib.Path(REPO_ROOT)
    for file in sorted((root / RUNNER_PACKAGE).rglob('*.py')):
        path = file.relative_to(root).as_posix()
        for name, line in runner_internals_used(
                file.read_text(encoding='utf-8'), path, names):
            found.setdefault(name, []).append(f'{path}:{line}')
    return found


def test_safe_runner_uses_only_the_listed_mmengine_internals():
    from mmsafe.engine.runner.safe_runner import MMENGINE_PRIVATE
    found = _runner_scan()
    unlisted = {name: where for name, where in found.items()
                if name not in MMENGINE_PRIVATE}
    assert not unlisted, (
        "private parts of MMEngine's Runner used by SafeRunner or the "
        'modules it delegates to, not listed in MMENGINE_PRIVATE (use the '
        'public attribute or extension point, or list it with why):\n' +
        '\n'.join(f'{name}: {where}' for name, where in unlisted.items()))
    assert not set(MMENGINE_PRIVATE) - set(found), sorted(
        set(MMENGINE_PRIVATE) - set(found))
    assert all(isinstance(why, str) and len(why) > 20
               for why in MMENGINE_PRIVATE.values())


def test_the_runner_scan_sees_self_super_runner_and_overrides():
    names = mmengine_runner_private_names()
    assert {'_train_loop', '_load_from', '_has_loaded',
            '_init_model_weights'} <= names
    source = ('class R:\n'
              '    def _init_model_weights(self):\n'
              '        super()._init_model_weights()\n'
              '    def f(self, runner):\n'
              '        self._mine = self._load_from\n'
              "        return runner._train_loop, getattr(self, '_resume')\n")
    assert sorted(runner_internals_used(source, 'x.py', names)) == [
        ('_init_model_weights', 2), ('_init_model_weights', 3),
        ('_load_from', 5), ('_resume', 6), ('_train_loop', 6)]

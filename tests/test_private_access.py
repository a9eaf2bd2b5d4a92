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
"""
import ast
import pathlib

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
    ('mmsafe/engine/first_batch_stats/channels.py', 'pre',
     '_channel_conversion'):
        "MMEngine/MMDetection preprocessors' channel swap setting",
    ('mmsafe/engine/hang_watchdog/report.py', 'os', '_exit'):
        'public API of the standard library',
    ('mmsafe/engine/hang_watchdog/stacks.py', 'sys', '_current_frames'):
        'public API of the standard library',
    ('mmsafe/engine/loops.py', 'infinite', '_iterator'):
        'the DataLoader iterator inside MMEngine\'s '
        '_InfiniteDataloaderIterator',
    ('mmsafe/engine/macl_check/signals.py', 'p', '_version'):
        "a tensor's in-place version counter",
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

"""Importing mmsafe registers and changes nothing else; no mmsafe code
reassigns a method of an object it does not own.

1. Identity count: every attribute of every loaded module of torch,
   MMEngine, MMCV and MMDetection (and every attribute of their classes),
   plus ``builtins`` and ``sys.excepthook``, is the same object before and
   after ``import mmsafe``.
2. A source scan (AST) of ``mmsafe/``: no ``setattr``/``delattr`` on a
   foreign object, no ``del obj.attr``, no assignment to an attribute named
   like a method of MMEngine/PyTorch objects (except an object's own), and
   no assignment to an attribute of a runner, loop, metric, model,
   optimizer wrapper, module or class. Setting documented state is allowed
   only where listed below, with why.
"""
import ast
import pathlib
import subprocess
import sys
import textwrap

from tests.utils import REPO_ROOT

IDENTITY_SCRIPT = r'''
import importlib
import inspect
import pkgutil
import sys

import torch  # noqa: F401
import mmengine
import mmcv
import mmdet

for pkg in (mmengine, ):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):
        try:
            importlib.import_module(info.name)
        except Exception:
            pass
for name in ('mmdet.models', 'mmdet.datasets', 'mmdet.engine',
             'mmdet.evaluation', 'mmdet.apis', 'mmcv.ops', 'mmcv.transforms',
             'torch.distributed', 'torch.nn.parallel', 'torch.optim',
             'torch.utils.data', 'torch.serialization', 'torch.hub',
             'torch.amp'):
    importlib.import_module(name)

PREFIXES = ('torch', 'mmengine', 'mmcv', 'mmdet', 'builtins', 'sys')


def snapshot():
    ids = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(PREFIXES):
            continue
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for key, value in items:
            ids[(name, key)] = id(value)
            if inspect.isclass(value) and value.__module__ == name:
                for attr, member in list(vars(value).items()):
                    ids[(name, key + '.' + attr)] = id(member)
    return ids


before = snapshot()
import mmsafe  # noqa: E402,F401
after = snapshot()
modules_before = {name for name, _ in before}
changed = sorted(k for k in before if k in after and before[k] != after[k])
# importing a module of a package binds it on the package, and a warning
# notes itself in its module's __warningregistry__: neither rebinds anything
# (mmsafe's import imports MMDetection's registering modules)
added = sorted(k for k in after
               if k not in before and k[0] in modules_before
               and f'{k[0]}.{k[1]}' not in sys.modules
               and k[1] != '__warningregistry__')
print('CHANGED', len(changed))
for key in changed:
    print('  changed', *key)
print('ADDED', len(added))
for key in added:
    print('  added', *key)
'''


def test_import_rebinds_nothing():
    result = subprocess.run(
        [sys.executable, '-c', IDENTITY_SCRIPT], cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert 'CHANGED 0' in out and 'ADDED 0' in out, out


# Names a hook or wrapper receives for objects it does not own.
FOREIGN = {'runner', 'loop', 'metric', 'evaluator', 'model', 'module',
           'optim_wrapper', 'wrapper', 'optimizer', 'dataloader', 'loader',
           'iterator', 'it', 'head', 'hook', 'sys', 'torch', 'dist',
           'torch_dist', 'os', 'builtins', 'function', 'fn'}

# Methods of MMEngine/PyTorch objects: assigning one is a patch, whatever
# the object is called.
METHOD_NAMES = {'run', 'run_iter', 'run_epoch', 'call_hook', 'process',
                'compute_metrics', 'evaluate', 'step', 'backward',
                'zero_grad', 'update_params', 'forward', 'loss', 'predict',
                'train_step', 'val_step', 'test_step', 'load_or_resume',
                'load_checkpoint', 'save_checkpoint', 'resume', 'setup_env',
                'wrap_model', '__init__', '__next__', '__iter__', 'excepthook',
                'build'}

# (file, assigned target): documented state of an object mmsafe does not
# own, set through its public attribute, with the reason.
ALLOWED = {
    # IterBasedTrainLoop and EpochBasedTrainLoop read this flag to stop.
    ('mmsafe/engine/runner/stop.py', 'loop.stop_training'),
    # The loss-weight probe scales a loss module's numeric ``loss_weight``
    # for one extra forward (RNG and buffers restored) and restores it in a
    # ``finally``: the lint's measurement, not a change of the model.
    ('mmsafe/engine/hooks/loss_dict_lint_hook.py', 'module.loss_weight'),
    # The probe's fallback points the loop at the rebuilt DataLoader through
    # the loop's two public attributes, before its first batch (invariants
    # in replace_loop_loader's docstring).
    ('mmsafe/engine/loops.py', 'loop.dataloader'),
    ('mmsafe/engine/loops.py', 'loop.dataloader_iterator'),
    # SafeRunner.build_dataloader wraps the worker_init_fn of the DataLoader
    # it has just built, before any iterator exists: the workers then
    # outlive a job-wide stop signal (the wrapper calls the original).
    ('mmsafe/engine/runner/dataloader.py', 'loader.worker_init_fn'),
    # The probe's own DataLoader copy and iterator (built by mmsafe, never
    # the loop's): its per-batch wait, and forgetting its iterator.
    ('mmsafe/datasets/loader/probe.py', 'it._timeout'),
    ('mmsafe/datasets/loader/probe.py', 'probe._iterator'),
    # Shutting down a replaced loader's workers: the DataLoader then starts
    # fresh ones on its next iter(); a killed iterator's pids leave torch's
    # SIGCHLD watch before the kill.
    ('mmsafe/datasets/loader/processes.py', 'loader._iterator'),
    ('mmsafe/datasets/loader/processes.py', 'it._worker_pids_set'),
    # The tools: `--resume` sets the config's `resume` key (a Config entry
    # named like Runner.resume), as MMDetection's tools/train.py does.
    ('mmsafe/tools/train.py', 'cfg.resume'),
    # preflight --json: its own process's log lines go to stderr while the
    # checks run, so that stdout carries the JSON only; restored after.
    ('mmsafe/tools/preflight.py', 'sys.stdout'),
    # eval_kaist gives the Evaluator it built the dataset's metainfo, as
    # MMEngine's runner does (Evaluator.dataset_meta is a public setter).
    ('mmsafe/tools/eval_kaist.py', 'evaluator.dataset_meta'),
}


def _foreign_targets(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    imported = {alias.asname or alias.name.split('.')[0]
                for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ('setattr', 'delattr'):
            first = node.args[0] if node.args else None
            if not (isinstance(first, ast.Name) and first.id == 'self'):
                yield node.lineno, ast.unparse(node)[:70]
        if isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Attribute):
                    yield node.lineno, 'del ' + ast.unparse(target)
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            parts = target.elts if isinstance(target, ast.Tuple) else [target]
            for part in parts:
                if not isinstance(part, ast.Attribute):
                    continue
                base = part.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if not isinstance(base, ast.Name):
                    continue
                name = base.id
                if part.attr in METHOD_NAMES and not (
                        name in ('self', 'cls')
                        and isinstance(part.value, ast.Name)):
                    yield node.lineno, ast.unparse(part)
                elif name in ('self', 'cls'):
                    continue  # the object's own state
                elif (name in FOREIGN or name in imported
                        or name[:1].isupper()):
                    yield node.lineno, ast.unparse(part)


def test_no_foreign_attribute_is_reassigned():
    root = pathlib.Path(REPO_ROOT)
    found = []
    for path in sorted((root / 'mmsafe').rglob('*.py')):
        rel = path.relative_to(root).as_posix()
        for line, target in _foreign_targets(path):
            if (rel, target) not in ALLOWED:
                found.append(f'{rel}:{line}: {target}')
    assert not found, 'attributes of foreign objects reassigned:\n' + \
        textwrap.indent('\n'.join(found), '  ')


def test_no_reference_to_files_outside_the_repository():
    """Code, configs and docs stand alone: no file of the repository points
    at design notes kept outside it."""
    outside = ['CONTEXT' + '.md', 'DESIGN' + '.md', '../' + 'shared/']
    files = subprocess.run(['git', 'ls-files'], cwd=REPO_ROOT,
                           capture_output=True, text=True,
                           check=True).stdout.split()
    found = []
    for rel in files:
        path = pathlib.Path(REPO_ROOT) / rel
        if not path.is_file() or path.suffix not in (
                '.py', '.md', '.sh', '.bat', '.txt', '.cfg', '.toml', ''):
            continue
        text = path.read_text(errors='replace')
        found += [f'{rel}: {name}' for name in outside if name in text]
    assert not found, found

"""Safe checkpoint loading, atomic saving and robust auto-resume.

PyTorch >= 2.6 loads with ``weights_only=True`` by default, and MMEngine
0.10.x then fails on its own checkpoints (its message hub pickles
``HistoryBuffer`` objects holding numpy arrays, and the bound statistics
methods of ``HistoryBuffer`` as ``getattr(HistoryBuffer, 'min')``). mmsafe
never turns ``weights_only`` off. Instead it allows exactly the objects that
MMEngine / MMDetection checkpoints hold (:data:`ALLOWED_GLOBALS`, found by
saving real runs) while MMEngine loads a checkpoint, and refuses any other
pickled object with :class:`UntrustedCheckpointError`, which names the object
and the explicit opt-in.

What :func:`install_checkpoint_safety` patches (each once, on import):

* ``CheckpointLoader.load_checkpoint`` (every MMEngine checkpoint load:
  ``load_from``, ``--resume``, ``load_checkpoint()``, http and other
  schemes): runs inside ``torch.serialization.safe_globals`` with the
  allowlist, and turns torch's "Weights only load failed" error into
  :class:`UntrustedCheckpointError`.
* ``mmengine.runner.checkpoint.save_checkpoint`` (also re-exported by
  ``mmengine.runner`` and imported by ``mmengine.runner.runner``): a local
  path is written atomically (temporary file in the same folder, flush,
  fsync, ``os.replace``, fsync of the folder); other backends are unchanged.
* ``CheckpointHook._save_checkpoint_with_step``: outdated checkpoints
  (``max_keep_ckpts``) are removed only after the new one is complete, and
  ``{work_dir}/last_checkpoint`` is replaced atomically after it.
* ``find_latest_checkpoint`` as used by ``Runner.load_or_resume``
  (auto-resume): returns the newest checkpoint that really loads, skipping a
  corrupt or truncated one with a warning.
* ``Runner.load_or_resume`` / ``Runner.load_checkpoint``: honour the config
  key ``mmsafe_trusted_globals``; ``Runner.resume`` records each resume as an
  event (``kind='resume'``) and in the message hub (``mmsafe/resume``).

Not covered: the DeepSpeed and ColossalAI strategies of ``FlexibleRunner``
bind ``save_checkpoint`` when they are imported and keep MMEngine's plain
write (their loading is covered); a process killed by ``kill -9`` between
the rename of a new checkpoint and the rewrite of ``last_checkpoint``
resumes from the previous checkpoint (one interval lost, nothing broken).

Opt-in for extra trusted objects (dotted names, only for checkpoints you
trust; ``weights_only`` stays on)::

    mmsafe_trusted_globals = ['my_pkg.my_module.MyClass']   # in a config
    MMSAFE_TRUSTED_GLOBALS=my_pkg.my_module.MyClass          # environment
"""
import contextlib
import glob
import importlib
import logging
import os
import os.path as osp
import pickle
import re
import zipfile
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

import torch

TRUSTED_GLOBALS_ENV = 'MMSAFE_TRUSTED_GLOBALS'
TRUSTED_GLOBALS_CFG_KEY = 'mmsafe_trusted_globals'
TMP_SUFFIX = '.mmsafe-tmp'

# Names that a config or the environment may never trust: each of them turns
# unpickling into running arbitrary code.
_NEVER_TRUSTED = re.compile(
    r'^(builtins|__builtin__|os|posix|nt|subprocess|sys|runpy|importlib|'
    r'shutil|pickle|_pickle|marshal|types|ctypes|code|codecs|pty|socket|'
    r'webbrowser|operator|functools)(\.|$)')


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds a pickled object that mmsafe does not trust."""


# --------------------------------------------------------------------------
# The allowlist
# --------------------------------------------------------------------------
def _history_buffer_method(owner: Any, name: str) -> Callable:
    """Stand-in for ``getattr`` during unpickling.

    ``HistoryBuffer.__getstate__`` stores its statistics methods, which
    pickle writes as ``getattr(HistoryBuffer, 'mean')``. Allowing the real
    ``getattr`` would let a checkpoint reach any attribute of any allowed
    object, so only the statistics methods of ``HistoryBuffer`` resolve.
    """
    from mmengine.logging import HistoryBuffer
    method = HistoryBuffer.__dict__.get(name) if owner is HistoryBuffer \
        else None
    # The built-in statistics are registered lazily (on the first
    # HistoryBuffer), custom ones through HistoryBuffer.register_statistics.
    known = set(HistoryBuffer._statistics_methods) | {
        'min', 'max', 'current', 'mean'}
    if (method is None or name.startswith('_') or not callable(method)
            or name not in known):
        raise UntrustedCheckpointError(
            f'getattr({getattr(owner, "__qualname__", owner)!r}, {name!r}) '
            'is not allowed while loading a checkpoint: only the statistics '
            'methods of mmengine.logging.HistoryBuffer resolve.')
    return method


def _numpy_globals() -> List[Any]:
    import numpy as np
    try:
        from numpy._core import multiarray  # numpy >= 2
        core_names = ('numpy._core.multiarray', 'numpy.core.multiarray')
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray  # type: ignore
        core_names = ('numpy.core.multiarray', 'numpy._core.multiarray')
    items: List[Any] = [np.ndarray, np.dtype]
    # Checkpoints saved under numpy 1.x name numpy.core, under 2.x
    # numpy._core; both resolve to the same functions here.
    for module in core_names:
        items.append((multiarray._reconstruct, f'{module}._reconstruct'))
        items.append((multiarray.scalar, f'{module}.scalar'))
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        # Every plain data dtype class; ObjectDType and VoidDType (arbitrary
        # Python objects / structured records) are left out on purpose.
        for name in dir(dtypes):
            if name.endswith('DType') and name not in ('ObjectDType',
                                                       'VoidDType'):
                items.append(getattr(dtypes, name))
    return items


def allowed_globals() -> List[Any]:
    """Objects (or ``(object, dotted name)`` pairs) that MMEngine and
    MMDetection checkpoints need besides torch's defaults.

    torch already allows tensors, storages, ``OrderedDict``, ``Counter``
    (``MultiStepLR.milestones``), ``torch.Size`` and ``torch.device``.
    Everything below was found by loading checkpoints of real runs: message
    hub buffers, numpy scalars, arrays and dtypes.
    """
    from mmengine.logging import HistoryBuffer
    return [HistoryBuffer, (_history_buffer_method, 'builtins.getattr'),
            *_numpy_globals()]


ALLOWED_GLOBALS: List[Any] = []  # filled by install_checkpoint_safety()
_EXTRA_TRUSTED: List[Any] = []  # from the environment and configs


def _resolve_dotted(name: str) -> Any:
    parts = name.split('.')
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f'cannot import {name!r}')


def resolve_trusted_globals(names: Iterable[str]) -> List[Tuple[Any, str]]:
    """Turn dotted names into ``(object, name)`` pairs for ``safe_globals``.

    Args:
        names (Iterable[str]): dotted names such as ``'pkg.mod.MyClass'``.

    Returns:
        list[tuple]: pairs accepted by ``torch.serialization.safe_globals``.
    """
    pairs = []
    for name in names:
        name = name.strip()
        if not name:
            continue
        if _NEVER_TRUSTED.match(name):
            raise ValueError(
                f'[mmsafe] {name!r} cannot be trusted for checkpoint '
                'loading: an object from that module lets a checkpoint run '
                'arbitrary code. Re-save the checkpoint without it instead.')
        try:
            pairs.append((_resolve_dotted(name), name))
        except (ImportError, AttributeError) as err:
            raise ValueError(
                f'[mmsafe] trusted checkpoint global {name!r} cannot be '
                f'imported: {err}') from err
    return pairs


def _env_trusted() -> List[Tuple[Any, str]]:
    return resolve_trusted_globals(
        os.environ.get(TRUSTED_GLOBALS_ENV, '').split(','))


@contextlib.contextmanager
def trusted_checkpoint_globals(extra: Iterable[Any] = ()) -> Iterator[None]:
    """Context in which ``torch.load`` (``weights_only=True``) accepts what
    MMEngine / MMDetection checkpoints need, plus ``extra``."""
    items = [*ALLOWED_GLOBALS, *_EXTRA_TRUSTED, *_env_trusted(), *extra]
    # torch's own safe_globals context removes its items on exit, even those
    # an enclosing context or the user added; restore the exact set instead.
    serialization = torch.serialization
    saved = serialization.get_safe_globals()
    serialization.add_safe_globals(items)
    try:
        yield
    finally:
        serialization.clear_safe_globals()
        serialization.add_safe_globals(saved)


@contextlib.contextmanager
def _trust_from_cfg(cfg: Any) -> Iterator[None]:
    names = cfg.get(TRUSTED_GLOBALS_CFG_KEY, None) if cfg is not None \
        else None
    if not names:
        yield
        return
    if isinstance(names, str):
        names = [names]
    pairs = resolve_trusted_globals(names)
    _EXTRA_TRUSTED.extend(pairs)
    try:
        yield
    finally:
        del _EXTRA_TRUSTED[len(_EXTRA_TRUSTED) - len(pairs):]


_REFUSED_PATTERNS = (
    re.compile(r'Unsupported global: GLOBAL (\S+) was not an allowed'),
    re.compile(r'Trying to load unsupported GLOBAL (\S+) whose module'),
    re.compile(r"(?:but got|unrecognized function) <class '([^']+)'>"),
    re.compile(r'unrecognized function (<[^>]+>|\S+)'),
    re.compile(r'Can only (?:build|create new object)[^<]*?but got (\S+)'),
    re.compile(r'(getattr\([^)]*\)) is not allowed while loading'),
)


def refused_object(error: BaseException) -> Optional[str]:
    """The name of the object that made a weights-only load fail, if any."""
    text = str(error)
    for pattern in _REFUSED_PATTERNS:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def _explain_refusal(filename: str, error: BaseException) -> str:
    name = refused_object(error) or '<unknown>'
    detail = str(error)
    if 'WeightsUnpickler error:' in detail:
        detail = detail.split('WeightsUnpickler error:', 1)[1]
        detail = detail.split('Check the documentation', 1)[0]
    return (
        f'[mmsafe] Refused to load checkpoint {filename!r}: it holds the '
        f'pickled object `{name}`, which MMEngine/MMDetection checkpoints do '
        'not need. Loading an unknown object can run arbitrary code, so '
        'mmsafe keeps torch.load(weights_only=True). If you trust this file '
        f'and `{name}`, allow it explicitly: add `{TRUSTED_GLOBALS_CFG_KEY} '
        f"= ['{name}']` to the config, or set the environment variable "
        f'{TRUSTED_GLOBALS_ENV}={name} (comma-separated). '
        f'(torch: {detail.strip()})')


# --------------------------------------------------------------------------
# Atomic saving
# --------------------------------------------------------------------------
def _fsync_dir(dirname: str) -> None:
    # Makes the rename itself durable; not possible on Windows.
    if os.name != 'posix':
        return
    fd = os.open(dirname, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tmp_path(filename: str) -> str:
    dirname, base = osp.split(osp.abspath(filename))
    return osp.join(dirname, f'.{base}.{os.getpid()}{TMP_SUFFIX}')


def _remove_stale_tmp_files(dirname: str) -> None:
    """Remove temporary files left by a save whose process was killed."""
    for path in glob.glob(osp.join(dirname, f'.*{TMP_SUFFIX}')):
        match = re.search(r'\.(\d+)' + re.escape(TMP_SUFFIX) + '$', path)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        # On Windows os.kill would terminate the process; there a file that
        # another process still writes cannot be removed anyway.
        if os.name == 'posix':
            try:
                os.kill(int(match.group(1)), 0)
                continue  # its writer is still alive
            except ProcessLookupError:
                pass
            except OSError:
                continue
        with contextlib.suppress(OSError):
            os.remove(path)
            _log(f'removed {path}, left by an interrupted checkpoint save.')


def atomic_write(filename: str, write: Callable[[Any], None],
                 mode: str = 'wb') -> None:
    """Write ``filename`` so that it is either complete or absent/unchanged.

    Args:
        filename (str): the final path.
        write (Callable): called with the open temporary file.
        mode (str): ``'wb'`` or ``'w'``.
    """
    filename = osp.abspath(filename)
    dirname = osp.dirname(filename)
    os.makedirs(dirname, exist_ok=True)
    tmp = _tmp_path(filename)
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, filename)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(dirname)


def atomic_torch_save(obj: Any, filename: str) -> None:
    """``torch.save`` to a local path through :func:`atomic_write`."""
    atomic_write(filename, lambda f: torch.save(obj, f))
    _remove_stale_tmp_files(osp.dirname(osp.abspath(filename)))


def _is_local(filename: Any, file_client_args: Optional[dict],
              backend_args: Optional[dict]) -> bool:
    if file_client_args is not None or not isinstance(filename, str):
        return False
    if '://' in filename:
        return False
    from mmengine.fileio import LocalBackend, get_file_backend
    return isinstance(
        get_file_backend(filename, backend_args=backend_args), LocalBackend)


class _AtomicTextFile:
    """What ``open(path, 'w')`` returns inside MMEngine's checkpoint hook:
    the text is written when the ``with`` block ends, atomically."""

    def __init__(self, path: str):
        self._path = path
        self._parts: List[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def __enter__(self) -> '_AtomicTextFile':
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            text = ''.join(self._parts)
            atomic_write(self._path, lambda f: f.write(text), mode='w')


def _checkpoint_hook_open(file, mode='r', *args, **kwargs):
    # Only the text write of ``last_checkpoint`` goes through here.
    if mode == 'w' and not args and not kwargs:
        return _AtomicTextFile(file)
    return open(file, mode, *args, **kwargs)


class _DeferredRemovals:
    """File backend proxy that postpones removing outdated checkpoints until
    the new checkpoint is complete (MMEngine removes them before saving, so a
    kill during the save would leave none with ``max_keep_ckpts=1``)."""

    def __init__(self, backend: Any):
        self._backend = backend
        self.pending: List[Tuple[str, str]] = []

    def remove(self, path: str) -> None:
        self.pending.append(('remove', path))

    def rmtree(self, path: str) -> None:
        self.pending.append(('rmtree', path))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


# --------------------------------------------------------------------------
# Choosing the checkpoint to resume from
# --------------------------------------------------------------------------
def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be resumed from, or None when it loads.

    The zip container is CRC-checked and the pickle is loaded with
    ``weights_only=True`` (memory-mapped, so tensors are not read twice).

    Raises:
        UntrustedCheckpointError: the file holds an untrusted object; that
            is a decision for the user, never a reason to skip silently.
    """
    if not osp.isfile(path):
        return 'file does not exist'
    try:
        mmap = zipfile.is_zipfile(path)
        if mmap:
            with zipfile.ZipFile(path) as zf:
                bad = zf.testzip()
            if bad is not None:
                return f'corrupt entry {bad!r} (CRC mismatch)'
        with trusted_checkpoint_globals():
            ckpt = torch.load(path, map_location='cpu', weights_only=True,
                              mmap=mmap)
    except pickle.UnpicklingError as err:
        if refused_object(err) is not None:
            raise UntrustedCheckpointError(_explain_refusal(path, err)) \
                from None
        return f'{type(err).__name__}: {err}'
    except Exception as err:  # any failure to read means: do not use it
        return f'{type(err).__name__}: {str(err).splitlines()[0][:200]}'
    # Runner.resume reads these three; a published model lacks the hub.
    missing = [key for key in ('meta', 'state_dict', 'message_hub')
               if not isinstance(ckpt, dict) or key not in ckpt]
    if missing:
        return f'not a resumable training checkpoint (no {missing})'
    return None


def _resumable_candidates(directory: str) -> List[str]:
    paths = [p for p in glob.glob(osp.join(directory, '*.pth'))
             if osp.isfile(p)]
    return sorted(paths, key=osp.getmtime, reverse=True)


def find_latest_loadable_checkpoint(path: str) -> Optional[str]:
    """Auto-resume target: the checkpoint named in ``last_checkpoint`` when
    it loads, otherwise the newest other ``*.pth`` next to it that loads.

    Args:
        path (str): the work dir.

    Returns:
        str or None: None when the work dir has no checkpoint at all.

    Raises:
        RuntimeError: checkpoints exist but none of them loads.
    """
    pointer_file = osp.join(path, 'last_checkpoint')
    pointed = None
    if osp.exists(pointer_file):
        with open(pointer_file) as f:
            pointed = f.read().strip() or None
    if pointed is not None and '://' in pointed:
        return pointed  # remote storage: MMEngine loads it as before
    directory = osp.dirname(pointed) if pointed else path
    candidates = ([pointed] if pointed else []) + [
        p for p in _resumable_candidates(directory) if p != pointed]
    if not candidates:
        _log('Did not find last_checkpoint to be resumed.', logging.INFO)
        return None
    if pointed is None:
        _log(f'{pointer_file} is missing or empty; looking for the newest '
             f'loadable checkpoint in {directory}.', logging.WARNING)
    skipped = []
    for candidate in candidates:
        problem = checkpoint_problem(candidate)
        if problem is None:
            if skipped:
                _report_skipped(path, skipped, candidate)
            return candidate
        skipped.append((candidate, problem))
    raise RuntimeError(
        '[mmsafe] Cannot resume: no checkpoint in '
        f'{directory} loads: ' + '; '.join(f'{p}: {why}'
                                           for p, why in skipped))


def _report_skipped(work_dir: str, skipped: List[Tuple[str, str]],
                    chosen: str) -> None:
    from mmengine.dist import is_main_process

    from mmsafe.events import write_event
    for path, problem in skipped:
        _log(f'Skipping checkpoint {path} for auto-resume: it does not load '
             f'({problem}). Resuming from {chosen} instead.',
             logging.WARNING)
        if is_main_process():
            write_event(work_dir, 'resume_skipped_checkpoint',
                        checkpoint=path, problem=problem, chosen=chosen)


# --------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------
def _log(message: str, level: int = logging.WARNING) -> None:
    from mmsafe.events import log
    log(message, level)


def install_checkpoint_safety() -> None:
    """Apply the patches listed in this module's docstring (idempotent)."""
    from mmengine.hooks import checkpoint_hook
    from mmengine.runner import checkpoint as mm_ckpt
    from mmengine.runner import runner as mm_runner

    if getattr(mm_ckpt, '_mmsafe_checkpoint_safety', False):
        return
    mm_ckpt._mmsafe_checkpoint_safety = True
    ALLOWED_GLOBALS[:] = allowed_globals()

    loader = mm_ckpt.CheckpointLoader
    original_load = loader.load_checkpoint.__func__

    def load_checkpoint(cls, filename, map_location=None, logger='current'):
        with trusted_checkpoint_globals():
            try:
                return original_load(cls, filename, map_location, logger)
            except pickle.UnpicklingError as err:
                if isinstance(err, UntrustedCheckpointError) or \
                        refused_object(err) is None:
                    raise
                raise UntrustedCheckpointError(
                    _explain_refusal(filename, err)) from None

    loader.load_checkpoint = classmethod(load_checkpoint)

    original_save = mm_ckpt.save_checkpoint

    def save_checkpoint(checkpoint, filename, file_client_args=None,
                        backend_args=None):
        if _is_local(filename, file_client_args, backend_args):
            atomic_torch_save(checkpoint, filename)
        else:
            original_save(checkpoint, filename, file_client_args,
                          backend_args)

    save_checkpoint.__doc__ = original_save.__doc__
    import mmengine.runner as mm_runner_pkg
    from mmengine.runner import _flexible_runner
    for module in (mm_ckpt, mm_runner, mm_runner_pkg):
        module.save_checkpoint = save_checkpoint
        module.find_latest_checkpoint = find_latest_loadable_checkpoint
    _flexible_runner.find_latest_checkpoint = find_latest_loadable_checkpoint

    # ``open`` inside mmengine/hooks/checkpoint_hook.py is only used to
    # write last_checkpoint; a module global shadows the builtin there.
    checkpoint_hook.open = _checkpoint_hook_open
    hook_cls = checkpoint_hook.CheckpointHook
    original_with_step = hook_cls._save_checkpoint_with_step

    def _save_checkpoint_with_step(self, runner, step, meta):
        backend = self.file_backend
        deferred = _DeferredRemovals(backend)
        self.file_backend = deferred
        try:
            original_with_step(self, runner, step, meta)
        finally:
            self.file_backend = backend
        for operation, target in deferred.pending:
            getattr(backend, operation)(target)

    hook_cls._save_checkpoint_with_step = _save_checkpoint_with_step

    runner_cls = mm_runner.Runner
    original_load_or_resume = runner_cls.load_or_resume
    original_runner_load = runner_cls.load_checkpoint
    original_resume = runner_cls.resume

    def load_or_resume(self):
        with _trust_from_cfg(getattr(self, 'cfg', None)):
            return original_load_or_resume(self)

    def runner_load_checkpoint(self, filename, *args, **kwargs):
        with _trust_from_cfg(getattr(self, 'cfg', None)):
            return original_runner_load(self, filename, *args, **kwargs)

    def resume(self, filename, *args, **kwargs):
        result = original_resume(self, filename, *args, **kwargs)
        _record_resume(self, filename)
        return result

    runner_cls.load_or_resume = load_or_resume
    runner_cls.load_checkpoint = runner_load_checkpoint
    runner_cls.resume = resume


def _record_resume(runner: Any, filename: str) -> None:
    from mmengine.dist import is_main_process

    from mmsafe.events import INFO_PREFIX, update_counters, write_event
    # The message hub was just restored from the checkpoint, so the count
    # carries over from earlier resumes of the same run.
    previous = runner.message_hub.runtime_info.get(INFO_PREFIX + 'resume',
                                                   {}) or {}
    count = int(previous.get('count', 0)) + 1
    update_counters('resume', count=count, last_checkpoint=filename,
                    last_iter=runner.iter, last_epoch=runner.epoch)
    if is_main_process():
        write_event(runner.work_dir, 'resume', checkpoint=filename,
                    iter=runner.iter, epoch=runner.epoch, count=count)
    _log(f'Resumed from {filename} at epoch {runner.epoch}, iteration '
         f'{runner.iter} (resume #{count} of this run).', logging.INFO)

"""Loading MMEngine/MMDetection checkpoints with ``weights_only=True``.

PyTorch >= 2.6 loads with ``weights_only=True`` by default, and MMEngine
0.10.x then fails on its own checkpoints (its message hub pickles
``HistoryBuffer`` objects holding numpy arrays, and the bound statistics
methods of ``HistoryBuffer`` as ``getattr(HistoryBuffer, 'min')``). Older
torch loads everything unrestricted by default. mmsafe loads weights-only on
every torch: :func:`load_checkpoint_file` is ``torch.load(weights_only=True)``
where torch can extend its allowlist (``add_safe_globals`` with
``(object, name)`` pairs), and ``torch.load`` with mmsafe's weights-only
unpickler (:mod:`.weights_unpickler`) elsewhere; both allow exactly the
objects that MMEngine / MMDetection checkpoints hold
(:func:`allowed_globals`) plus what :func:`trusted_checkpoint_globals` adds,
and refuse the same payloads. :func:`explain_refusals` turns a refusal into
:class:`UntrustedCheckpointError`, which names the object and the explicit
opt-in. :class:`~mmsafe.engine.runner.SafeRunner` loads every checkpoint
(``load_from``, ``resume``, pretrained ``init_cfg``) this way.

Opt-in for extra trusted objects (dotted names, only for checkpoints you
trust; ``weights_only`` stays on)::

    mmsafe_trusted_globals = ['my_pkg.my_module.MyClass']   # in a config
    MMSAFE_TRUSTED_GLOBALS=my_pkg.my_module.MyClass          # environment
"""
import contextlib
import importlib
import os
import pickle
import re
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

import torch

from mmsafe.compat import native_safe_globals
from .weights_unpickler import allowlist, pickle_module

TRUSTED_GLOBALS_ENV = 'MMSAFE_TRUSTED_GLOBALS'
TRUSTED_GLOBALS_CFG_KEY = 'mmsafe_trusted_globals'

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


#: the item lists of the trusted_checkpoint_globals contexts now open
_ACTIVE: List[List[Any]] = []


@contextlib.contextmanager
def trusted_checkpoint_globals(extra: Iterable[Any] = (),
                               cfg: Any = None) -> Iterator[None]:
    """Context in which ``torch.load`` (``weights_only=True``) accepts what
    MMEngine / MMDetection checkpoints need, plus the names of
    ``MMSAFE_TRUSTED_GLOBALS``, of ``cfg.mmsafe_trusted_globals`` and
    ``extra``.

    Args:
        extra (Iterable): objects or ``(object, dotted name)`` pairs.
        cfg (Config, optional): a config that may set
            ``mmsafe_trusted_globals`` (a dotted name or a list of them).
    """
    items = [*allowed_globals(), *_env_trusted(), *_cfg_trusted(cfg),
             *extra]
    _ACTIVE.append(items)
    # torch's own safe_globals context removes its items on exit, even those
    # an enclosing context or the user added; restore the exact set instead.
    serialization = torch.serialization
    native = native_safe_globals()
    if native:
        saved = serialization.get_safe_globals()
        serialization.add_safe_globals(items)
    try:
        yield
    finally:
        _ACTIVE.remove(items)
        if native:
            serialization.clear_safe_globals()
            serialization.add_safe_globals(saved)


def load_checkpoint_file(f: Any, map_location: Any = None,
                         mmap: Optional[bool] = None) -> Any:
    """``torch.load`` of ``f``, weights-only on every torch.

    Allowed: torch's weights-only objects, :func:`allowed_globals`, the
    trusted names of the environment, and what every open
    :func:`trusted_checkpoint_globals` context adds (e.g. a config's
    ``mmsafe_trusted_globals``).

    Raises:
        pickle.UnpicklingError: the file holds an object outside that set
            (nothing of it ran); :func:`explain_refusals` names it.
    """
    with trusted_checkpoint_globals():
        if native_safe_globals():
            return torch.load(f, map_location=map_location,
                              weights_only=True, mmap=mmap)
        items = [item for active in _ACTIVE for item in active]
        # This torch's weights_only allowlist cannot be extended: its
        # torch.load takes mmsafe's weights-only unpickler instead.
        return torch.load(
            f, map_location=map_location, mmap=mmap,
            pickle_module=pickle_module(
                allowlist(items)))


def _cfg_trusted(cfg: Any) -> List[Tuple[Any, str]]:
    names = cfg.get(TRUSTED_GLOBALS_CFG_KEY, None) if cfg is not None \
        else None
    if isinstance(names, str):
        names = [names]
    return resolve_trusted_globals(names or [])


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


def explain_refusal(filename: str, error: BaseException) -> str:
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




@contextlib.contextmanager
def explain_refusals(filename: str) -> Iterator[None]:
    """Re-raise a weights-only refusal met while loading ``filename`` as
    :class:`UntrustedCheckpointError` with the object's name and the
    opt-in; every other error passes unchanged."""
    try:
        yield
    except pickle.UnpicklingError as err:
        if isinstance(err, UntrustedCheckpointError) or \
                refused_object(err) is None:
            raise
        raise UntrustedCheckpointError(explain_refusal(filename, err)) \
            from None


def load_local_checkpoint(filename: str, map_location: Any = None) -> Any:
    """MMEngine's ``load_from_local`` (the CheckpointLoader scheme of plain
    paths), loading weights-only with :func:`load_checkpoint_file`."""
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return load_checkpoint_file(filename, map_location)


def register_local_weights_only_scheme() -> None:
    """Register :func:`load_local_checkpoint` for local paths (the empty
    prefix) through MMEngine's ``CheckpointLoader.register_scheme``, so
    that ``load_from``, ``resume`` and pretrained weights from files load
    weights-only on every torch (MMEngine's own loader calls a plain
    ``torch.load``, unrestricted before torch 2.6). Idempotent;
    :class:`~mmsafe.engine.runner.SafeRunner` calls it when it is built."""
    from mmengine.runner import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', loader=load_local_checkpoint,
                                     force=True)

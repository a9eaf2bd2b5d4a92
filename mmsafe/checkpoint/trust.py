"""Which objects a checkpoint may hold beyond plain data, and the errors
that say what was refused.

mmsafe loads every checkpoint with its own weights-only loader
(:func:`~.loader.load_checkpoint_file`), the same on every torch; it
accepts the plain data of MMEngine/MMDetection checkpoints
(:mod:`.allowlist`). A project that keeps its own objects in checkpoints
may opt in per class or function, for files it trusts; ``weights_only``
stays on for everything else::

    mmsafe_trusted_globals = ['my_pkg.my_module.MyClass']   # in a config
    MMSAFE_TRUSTED_GLOBALS=my_pkg.my_module.MyClass          # environment

Names are trusted by identity (:mod:`.trusted_names`): resolved, and
compared by the object's own module and qualified name; objects of the
never-trusted modules are refused under any name.
:class:`~mmsafe.engine.runner.SafeRunner` opens
:func:`trusted_checkpoint_globals` with its config around every load.
"""
import contextlib
import os
import pickle
import re
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from mmsafe.errors import MMSafeValueError
from .errors import CheckpointFormatError, UntrustedCheckpointError
from .trusted_names import (TRUSTED_GLOBALS_CFG_KEY, TRUSTED_GLOBALS_ENV,
                            opt_in_hint, own_name, resolve_trusted_globals,
                            resolve_trusted_name)

__all__ = [
    'CheckpointFormatError', 'UntrustedCheckpointError',
    'TRUSTED_GLOBALS_CFG_KEY', 'TRUSTED_GLOBALS_ENV',
    'resolve_trusted_globals', 'trusted_checkpoint_globals',
    'active_trusted_globals', 'refused_object', 'explain_refusal',
    'explain_refusals'
]

#: the (object, own name) lists of the trusted_checkpoint_globals contexts
#: now open
_ACTIVE: List[List[Tuple[Any, str]]] = []


def _trust_object(obj: Any) -> Tuple[Any, str]:
    name = own_name(obj)
    if name is None:
        raise MMSafeValueError(f'[mmsafe] {obj!r} cannot be trusted for '
                               'checkpoint loading: only classes and Python '
                               'functions')
    resolved, name = resolve_trusted_name(name)
    if resolved is not obj:
        raise MMSafeValueError(
            f'[mmsafe] {obj!r} is not what its name {name!r} '
            'resolves to')
    return obj, name


def _cfg_trusted(cfg: Any) -> List[Tuple[Any, str]]:
    names = cfg.get(TRUSTED_GLOBALS_CFG_KEY, None) if cfg is not None \
        else None
    if isinstance(names, str):
        names = [names]
    return resolve_trusted_globals(names or [])


def _env_trusted() -> List[Tuple[Any, str]]:
    return resolve_trusted_globals(
        os.environ.get(TRUSTED_GLOBALS_ENV, '').split(','))


@contextlib.contextmanager
def trusted_checkpoint_globals(extra: Iterable[Any] = (),
                               cfg: Any = None) -> Iterator[None]:
    """Context in which checkpoint loads accept, beyond plain data, the
    classes and functions of ``MMSAFE_TRUSTED_GLOBALS``, of
    ``cfg.mmsafe_trusted_globals`` and ``extra``.

    Args:
        extra (Iterable): classes or functions to trust.
        cfg (Config, optional): a config that may set
            ``mmsafe_trusted_globals`` (a dotted name or a list of them).

    Raises:
        ValueError: a name cannot be trusted (never-trusted module, not a
            class or function, not importable).
    """
    items = [*_env_trusted(), *_cfg_trusted(cfg),
             *(_trust_object(obj) for obj in extra)]
    _ACTIVE.append(items)
    try:
        yield
    finally:
        _ACTIVE.remove(items)


def active_trusted_globals() -> Dict[str, Any]:
    """Own name -> object of everything trusted now: the environment's
    names and those of every open :func:`trusted_checkpoint_globals`."""
    found = dict((name, obj) for obj, name in _env_trusted())
    for items in _ACTIVE:
        found.update((name, obj) for obj, name in items)
    return found


# ------------------------------------------------------------ refusals --
#: how torch's own weights-only loader names what it refused (a load that
#: does not go through mmsafe's loader, e.g. another package's scheme)
_TORCH_REFUSALS = (
    re.compile(r'Unsupported global: GLOBAL (\S+) was not an allowed'),
    re.compile(r'Trying to load unsupported GLOBAL (\S+) whose module'),
    re.compile(r"(?:but got|unrecognized function) <class '([^']+)'>"),
    re.compile(r'unrecognized function (<[^>]+>|\S+)'),
)


def refused_object(error: BaseException) -> Optional[str]:
    """The name of the object that made a weights-only load fail, if any
    (mmsafe's refusals carry it; torch's are parsed)."""
    name = getattr(error, 'global_name', None)
    if isinstance(name, str):
        return name
    if isinstance(error, UntrustedCheckpointError):
        return '<not plain data>'
    text = str(error)
    for pattern in _TORCH_REFUSALS:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def explain_refusal(filename: str, error: BaseException) -> str:
    """The message of an :class:`UntrustedCheckpointError` for a refusal of
    torch's own weights-only loader."""
    if isinstance(error, UntrustedCheckpointError):
        return str(error)
    name = refused_object(error) or '<unknown>'
    return (f'[mmsafe] Refused to load checkpoint {filename!r}: it holds '
            f'the pickled object `{name}`, which MMEngine/MMDetection '
            f'checkpoints do not need. {opt_in_hint(name)} '
            f'(torch: {str(error).strip()[:300]})')


@contextlib.contextmanager
def explain_refusals(filename: str) -> Iterator[None]:
    """mmsafe's refusals pass unchanged; a refusal of torch's own
    weights-only loader met while loading ``filename`` is re-raised as
    :class:`UntrustedCheckpointError` naming the object; every other error
    passes unchanged."""
    try:
        yield
    except pickle.UnpicklingError as err:
        if isinstance(err, (UntrustedCheckpointError,
                            CheckpointFormatError)) or \
                refused_object(err) is None:
            raise
        raise UntrustedCheckpointError(explain_refusal(filename, err),
                                       refused_object(err)) from err

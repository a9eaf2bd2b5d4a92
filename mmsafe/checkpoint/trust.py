"""Trust: which objects a checkpoint may hold beyond plain data, what a
load does with them, and how a refusal says whether one may be trusted.

mmsafe loads every checkpoint with its own weights-only loader
(:func:`~.loader.load_checkpoint_file`), the same on every torch; it
accepts the plain data of MMEngine/MMDetection checkpoints
(:mod:`.allowlist`). A project that keeps its own objects in checkpoints
may opt in per class or function, for files it trusts; ``weights_only``
stays on for everything else::

    mmsafe_trusted_globals = ['my_pkg.my_module.MyClass']   # in a config
    MMSAFE_TRUSTED_GLOBALS=my_pkg.my_module.MyClass          # environment

:class:`~mmsafe.engine.runner.SafeRunner` opens
:func:`trusted_checkpoint_globals` with its config around every load.

* **By identity.** A name is trusted by what it *is*: it is imported and
  resolved, and the object must be a class or a Python function whose own
  name (``obj.__module__ + '.' + obj.__qualname__``, the name pickles give
  it) resolves back to it; that own name is what the loader then accepts.
  Objects defined in a module of :data:`NEVER_TRUSTED` (the interpreter,
  the operating system, files, processes, code loading, and the frameworks
  whose functions load files or compile code) are refused whatever name
  reaches them: ``mmengine.logging.logger.os.system`` is ``posix.system``.
* **In a load** (:class:`TrustedObjects`): trusted objects are the real
  ones, since the user vouched for them: they are called, created and
  built as pickle does, positional arguments only, and what they make is
  accepted as data.
* **In a refusal** (:func:`opt_in_hint`): the object a checkpoint held is
  named and, only when that name already resolves in this process (looked
  up without importing anything, without running any attribute hook) to a
  class or function outside the never-trusted modules under its own name,
  the refusal shows how to trust it. A refusal of torch's own weights-only
  loader (a load through another package's scheme) is worded the same way
  (:func:`explain_refusals`).
"""
import contextlib
import contextvars
import importlib
import inspect
import os
import pickle
import re
import sys
import types
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional,
                    Tuple)

from mmsafe.errors import MMSafeImportError, MMSafeValueError
from .errors import (CheckpointRefusal, UntrustedCheckpointError,
                     refusal_message)

TRUSTED_GLOBALS_ENV = 'MMSAFE_TRUSTED_GLOBALS'
TRUSTED_GLOBALS_CFG_KEY = 'mmsafe_trusted_globals'

#: Top-level modules whose objects are never trusted: each offers a way to
#: run code, start processes, load other files or reach the file system
#: from a pickle.
NEVER_TRUSTED = frozenset({
    'builtins', '__builtin__', '__main__', 'os', 'posix', 'nt', 'posixpath',
    'ntpath', 'sys', 'subprocess', '_posixsubprocess', 'runpy', 'importlib',
    'imp', 'zipimport', 'pkgutil', 'site', 'sysconfig', 'shutil', 'pathlib',
    'glob', 'tempfile', 'io', '_io', 'fileinput', 'pickle', '_pickle',
    'copyreg', 'copy', 'marshal', 'shelve', 'dbm', 'types', 'ctypes',
    '_ctypes', 'code', 'codeop', 'codecs', '_codecs', 'compileall',
    'py_compile', 'ast', 'dis', 'inspect', 'pdb', 'bdb', 'cProfile',
    'profile', 'timeit', 'trace', 'pty', 'tty', 'socket', '_socket', 'ssl',
    'select', 'selectors', 'asyncio', 'webbrowser', 'urllib', 'http',
    'ftplib', 'smtplib', 'xmlrpc', 'multiprocessing', '_multiprocessing',
    'concurrent', 'threading', '_thread', 'signal', '_signal', 'gc',
    'atexit', 'resource', 'mmap', 'fcntl', 'operator', '_operator',
    'functools', '_functools', 'itertools', 'logging', 'zipfile', 'tarfile',
    'shlex', 'platform', 'ensurepip', 'venv', 'distutils', 'setuptools',
    'pip', 'pkg_resources', 'torch', 'numpy', 'mmengine', 'mmcv', 'mmdet',
    'mmsafe', 'dill', 'cloudpickle', 'joblib', 'yaml', 'pandas', 'scipy',
    'IPython', 'pytest', '_pytest'})

#: the (object, own name) pairs of the trusted_checkpoint_globals blocks
#: open in this context (thread, asyncio task), innermost last
_TRUSTED: contextvars.ContextVar[Tuple[Tuple[Any, str], ...]] = \
    contextvars.ContextVar('mmsafe_trusted_globals', default=())


# ------------------------------------------------------ what is trusted --
@contextlib.contextmanager
def trusted_checkpoint_globals(extra: Iterable[Any] = (),
                               cfg: Any = None) -> Iterator[None]:
    """Context in which checkpoint loads accept, beyond plain data, the
    classes and functions of ``MMSAFE_TRUSTED_GLOBALS``, of
    ``cfg.mmsafe_trusted_globals`` and ``extra``: loads of this thread (or
    asyncio task) inside the block, nested blocks adding to outer ones.

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
    token = _TRUSTED.set(_TRUSTED.get() + tuple(items))
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def active_trusted_globals() -> Dict[str, Any]:
    """Own name -> object of everything trusted now: the environment's
    names and those of every open :func:`trusted_checkpoint_globals`."""
    found = dict((name, obj) for obj, name in _env_trusted())
    found.update((name, obj) for obj, name in _TRUSTED.get())
    return found


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


def resolve_trusted_globals(names: Iterable[str]) -> List[Tuple[Any, str]]:
    """``(object, own name)`` pairs for ``names`` (empty ones skipped).

    Raises:
        ValueError: as :func:`resolve_trusted_name`.
    """
    pairs = []
    for name in names:
        name = name.strip()
        if name:
            pairs.append(resolve_trusted_name(name))
    return pairs


def resolve_trusted_name(name: str) -> Tuple[Any, str]:
    """``(object, own name)`` for a name to trust.

    Raises:
        ValueError: the name is never trusted, resolves into a never-trusted
            module, is not a class or Python function, or cannot be
            imported.
    """
    if never_trusted(name.split('.', 1)[0]):
        raise MMSafeValueError(
            f'[mmsafe] {name!r} cannot be trusted for checkpoint loading: '
            'objects of that module let a checkpoint run code or reach '
            'files. Re-save the checkpoint without it instead.')
    try:
        obj = _import_dotted(name)
    except (ImportError, AttributeError) as err:
        raise MMSafeValueError(f'[mmsafe] trusted checkpoint global {name!r} '
                               f'cannot be imported: {err}') from err
    canonical = own_name(obj)
    if canonical is None:
        raise MMSafeValueError(
            f'[mmsafe] trusted checkpoint global {name!r} is '
            f'{type(obj).__name__} {obj!r}: only classes and Python '
            'functions of your own modules can be trusted')
    module = obj.__module__
    if never_trusted(module):
        raise MMSafeValueError(
            f'[mmsafe] {name!r} cannot be trusted for checkpoint loading: '
            f'it is {canonical}, from {obj.__module__}, whose objects let a '
            'checkpoint run code or reach files.')
    try:
        again = _import_dotted(canonical)
    except (ImportError, AttributeError):
        again = None
    if again is not obj:
        raise MMSafeValueError(
            f'[mmsafe] trusted checkpoint global {name!r} is {canonical}, '
            f'which does not resolve back to it (from {module}): pickles '
            'could not name it')
    return obj, canonical


def never_trusted(module: Optional[str]) -> bool:
    """Whether objects of ``module`` (a dotted module name) are never
    trusted."""
    if not isinstance(module, str) or not module:
        return True
    return module.split('.', 1)[0] in NEVER_TRUSTED


def own_name(obj: Any) -> Optional[str]:
    """``module.qualname`` of a class or Python function (the name pickle
    writes for it); None for anything else."""
    if not isinstance(obj, (type, types.FunctionType)):
        return None
    module, qualname = obj.__module__, obj.__qualname__
    if not isinstance(module, str) or not isinstance(qualname, str) or \
            '<' in qualname:
        return None
    return f'{module}.{qualname}'


def defining_module(obj: Any) -> Optional[str]:
    """The module that defines ``obj`` (a module's own name for a
    module; the class's module for an instance)."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if isinstance(obj, (type, types.FunctionType,
                        types.BuiltinFunctionType)):
        module = obj.__module__
    else:
        module = type(obj).__module__
    return module if isinstance(module, str) else None


def _walk(obj: Any, parts: Iterable[str], static: bool) -> Any:
    for part in parts:
        obj = inspect.getattr_static(obj, part) if static else \
            getattr(obj, part)
    return obj


def _import_dotted(name: str) -> Any:
    parts = name.split('.')
    for cut in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module('.'.join(parts[:cut]))
        except ImportError:
            continue
        return _walk(module, parts[cut:], static=False)
    raise MMSafeImportError(f'no module of {name!r} can be imported')


# --------------------------------------------------------- in one load --
class TrustedObjects:
    """What one load trusts beyond plain data, and what those objects made.

    The allowlist (:class:`~.allowlist.CheckpointRules`) asks here after
    its own handlers; the plain-data check accepts what :meth:`holds`.

    Args:
        objects (dict, optional): own dotted name -> trusted class or
            function (:func:`active_trusted_globals`); none by default.
    """

    def __init__(self, objects: Optional[Dict[str, Any]] = None):
        self.objects = dict(objects or {})
        self._ids = {id(obj) for obj in self.objects.values()}
        self._types = tuple(obj for obj in self.objects.values()
                            if isinstance(obj, type))
        #: id -> object: what trusted classes and functions returned (kept,
        #: so that no id is reused during the load)
        self._made: Dict[int, Any] = {}

    def find(self, name: str) -> Optional[Any]:
        """The trusted object of the dotted ``name``; None if none."""
        return self.objects.get(name)

    def trusts(self, obj: Any) -> bool:
        """Whether ``obj`` is a trusted class or function."""
        return id(obj) in self._ids

    def made_by_trusted_class(self, obj: Any) -> bool:
        """Whether ``obj`` is an instance of a trusted class."""
        return bool(self._types) and type(obj) in self._types

    def holds(self, obj: Any) -> bool:
        """Whether the plain-data check accepts ``obj`` as it is (not
        walked): a trusted object, an instance of a trusted class, or what
        a trusted class or function returned in this load."""
        return self.made_by_trusted_class(obj) or id(obj) in self._ids or \
            id(obj) in self._made

    def call(self, func: Any, args: tuple) -> Any:
        """``REDUCE`` of a trusted function or class: ``func(*args)``."""
        return self._keep(func(*args))

    def new(self, cls: type, args: tuple) -> Any:
        """``NEWOBJ`` of a trusted class: ``cls.__new__(cls, *args)``."""
        return self._keep(cls.__new__(cls, *args))

    @staticmethod
    def build(obj: Any, state: Any) -> None:
        """``BUILD`` as pickle does it, for an instance of a trusted class
        (its own ``__setstate__``, or its ``__dict__``)."""
        if getattr(type(obj), '__setstate__', None) is not None:
            obj.__setstate__(state)
            return
        if type(state) is not dict or not all(type(k) is str
                                              for k in state):
            kind = type(obj)
            what = f'the class {obj.__module__}.{obj.__qualname__}' \
                if isinstance(obj, type) else \
                f'a {kind.__module__}.{kind.__qualname__}'
            raise UntrustedCheckpointError(
                f'a state of {type(state).__qualname__} for {what} (only a '
                'dict of attributes)')
        vars(obj).update({sys.intern(k): v for k, v in state.items()})

    @staticmethod
    def container_add(container: Any) -> Callable[[Any, Any], None]:
        """How ``SETITEM(S)``/``APPEND(S)`` add to an instance of a trusted
        class: as pickle does (``append``, or item assignment)."""

        def add(key: Any, value: Any) -> None:
            if key is None:
                container.append(value)
            else:
                container[key] = value

        return add

    def _keep(self, result: Any) -> Any:
        self._made[id(result)] = result
        return result


# ------------------------------------------------------------ refusals --
def opt_in_hint(name: str) -> str:
    """How (and whether) the object a checkpoint names may be trusted."""
    def never(why: str) -> str:
        # the name comes from the file: it is text, never a format string
        return (f'`{name}` can never be trusted, not even through '
                f'{TRUSTED_GLOBALS_CFG_KEY} or {TRUSTED_GLOBALS_ENV}: '
                f'{why}. Re-save the checkpoint without it.')

    top = name.split('.', 1)[0]
    if never_trusted(top):
        return never(f'it is in `{top}`, whose objects mmsafe never '
                     'trusts (they can run code, load other files or reach '
                     'the file system)')
    obj = _resolve_loaded(name)
    if obj is None:
        return (f'mmsafe did not import anything to look at `{name}` and '
                'suggests no opt-in for it; if it is a class of your own '
                'project and you trust this file, see '
                f'{TRUSTED_GLOBALS_CFG_KEY} in the docs.')
    defining = defining_module(obj)
    if never_trusted(defining):
        return never(f'it resolves to an object of `{defining}`, whose '
                     'objects mmsafe never trusts (they can run code, load '
                     'other files or reach the file system)')
    canonical = own_name(obj)
    if canonical is None:
        return (f'`{name}` is a {type(obj).__name__}, not a class or Python '
                'function; mmsafe suggests no opt-in for it.')
    if canonical != name:
        return (f'`{name}` is another name of `{canonical}`, not the name '
                'pickle gives it; mmsafe suggests no opt-in for it.')
    return (f'If you trust this file and `{name}`, allow it explicitly: add '
            f"`{TRUSTED_GLOBALS_CFG_KEY} = ['{name}']` to the config, or set "
            f'the environment variable {TRUSTED_GLOBALS_ENV}={name} '
            '(comma-separated); weights_only stays on.')


def _resolve_loaded(name: str) -> Any:
    """What ``name`` is in this process, found among the modules already
    imported and without running attribute hooks; None when not found."""
    parts = name.split('.')
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get('.'.join(parts[:cut]))
        if module is None:
            continue
        try:
            return _walk(module, parts[cut:], static=True)
        except AttributeError:
            return None
    return None


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
    return refusal_message(
        filename, f'it holds the pickled object `{name}`, which MMEngine/'
        f'MMDetection checkpoints do not need. {opt_in_hint(name)} '
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
        if isinstance(err, CheckpointRefusal) or \
                refused_object(err) is None:
            raise
        raise UntrustedCheckpointError(explain_refusal(filename, err),
                                       refused_object(err),
                                       filename=filename) from err

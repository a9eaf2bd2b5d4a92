"""Opt-in trust, by identity.

A config (``mmsafe_trusted_globals``) or the environment
(``MMSAFE_TRUSTED_GLOBALS``) may name extra classes or functions that a
checkpoint may hold. A name is trusted by what it *is*: it is imported and
resolved, and the object must be a class or a Python function whose own
name (``obj.__module__ + '.' + obj.__qualname__``, the name pickles give
it) resolves back to it; that own name is what the loader then accepts.
Objects defined in a module of :data:`NEVER_TRUSTED` (the interpreter, the
operating system, files, processes, code loading, and the frameworks whose
functions load files or compile code) are refused whatever name reaches
them: ``mmengine.logging.logger.os.system`` is ``posix.system``.

A refusal names the object a checkpoint held and, only when that name
already resolves in this process (looked up without importing anything,
without running any attribute hook) to a class or function outside the
never-trusted modules under its own name, shows how to trust it.
"""
import importlib
import inspect
import sys
import types
from typing import Any, Iterable, List, Optional, Tuple

from mmsafe.errors import MMSafeImportError, MMSafeValueError

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

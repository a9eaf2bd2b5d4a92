"""mmsafe's weights-only unpickler, for torch without ``add_safe_globals``.

``torch.load(weights_only=True)`` rebuilds only an allowlist of objects, and
torch >= 2.6 lets the allowlist grow (``add_safe_globals`` with
``(object, name)`` pairs), which is how mmsafe loads MMEngine checkpoints.
Older torch has a fixed allowlist that MMEngine's checkpoints do not fit, and
loads everything unrestricted by default. There, mmsafe passes this module's
unpickler to ``torch.load`` as its ``pickle_module``: the mechanism torch's
own ``weights_only=True`` uses, with the allowlist that mmsafe trusts.

It refuses, before anything runs:

* a global that is not on the allowlist (``os.system``, ``builtins.eval``,
  ``builtins.getattr`` unless stood in for, ...);
* calling anything but an allowed object (``REDUCE``), building or
  creating an instance of a class that is not allowed (``BUILD``,
  ``NEWOBJ``), setting attributes of a class, the protocol 0/1 object
  opcodes and the copyreg extension registry;
* numpy dtypes that hold Python objects (object arrays and scalars).
"""
import _compat_pickle
import collections
import functools
import pickle
from typing import Any, Dict, Iterable

import numpy as np
import torch

_REFUSE = pickle.UnpicklingError


def _name_of(obj: Any) -> str:
    kind = obj if isinstance(obj, type) else type(obj)
    return f'{kind.__module__}.{kind.__qualname__}'


def _object_dtype(value: Any) -> bool:
    return isinstance(value, np.dtype) and value.hasobject


class WeightsOnlyUnpickler(pickle._Unpickler):
    """A pure-Python unpickler that rebuilds allowlisted objects only.

    :func:`pickle_module` makes a subclass with :attr:`allowed` set.
    """

    #: dotted name -> object that the name resolves to while loading
    allowed: Dict[str, Any] = {}

    def __init__(self, file, **kwargs) -> None:
        super().__init__(file, **kwargs)
        values = self.allowed.values()
        self._callables = {id(v) for v in values}
        self._classes = {v for v in values if isinstance(v, type)}
        # numpy before 1.25 has no public classes for its dtypes: a dtype
        # instance is buildable when np.dtype itself is allowed.
        self._dtype_builds = np.dtype in self._classes

    # -- globals --------------------------------------------------------
    def find_class(self, module: str, name: str) -> Any:
        if self.proto < 3 and self.fix_imports:
            # protocol 2 (torch.save's) writes Python 2 names:
            # __builtin__.getattr is builtins.getattr
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full = f'{module}.{name}'
        try:
            return self.allowed[full]
        except KeyError:
            raise _REFUSE(
                f'Unsupported global: GLOBAL {full} was not an allowed '
                'global for a weights-only load') from None

    # -- opcodes that call or build -------------------------------------
    dispatch = dict(pickle._Unpickler.dispatch)

    def load_reduce(self) -> None:
        func = self.stack[-2]
        if id(func) not in self._callables:
            raise _REFUSE(f'Trying to call unrecognized function '
                          f'{func!r} in a weights-only load')
        pickle._Unpickler.load_reduce(self)
        if _object_dtype(self.stack[-1]):
            raise _REFUSE('Can only create new object dtypes of plain data, '
                          'but got numpy.dtype[object] (an object dtype)')

    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_build(self) -> None:
        state, inst = self.stack[-1], self.stack[-2]
        buildable = type(inst) in self._classes or (
            self._dtype_builds and isinstance(inst, np.dtype))
        if isinstance(inst, type) or not buildable:
            raise _REFUSE(f'Can only build instances of allowed classes, '
                          f'but got {_name_of(inst)}')
        if isinstance(state, tuple) and any(_object_dtype(s) for s in state):
            raise _REFUSE('Can only build arrays of plain data, but got '
                          'numpy.dtype[object] (an object array)')
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = load_build

    def _check_new(self, cls: Any) -> None:
        if not isinstance(cls, type) or cls not in self._classes:
            raise _REFUSE(f'Can only create new object of allowed classes, '
                          f'but got {_name_of(cls)}')

    def load_newobj(self) -> None:
        self._check_new(self.stack[-2])
        pickle._Unpickler.load_newobj(self)

    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self) -> None:
        self._check_new(self.stack[-3])
        pickle._Unpickler.load_newobj_ex(self)

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def _refuse_opcode(self) -> None:
        raise _REFUSE('this pickle opcode (protocol 0/1 object creation or '
                      'the copyreg extension registry) is not allowed in a '
                      'weights-only load')

    for _code in (pickle.INST, pickle.OBJ, pickle.EXT1, pickle.EXT2,
                  pickle.EXT4):
        dispatch[_code[0]] = _refuse_opcode
    del _code


class _PickleModule:
    """What ``torch.load`` needs of its ``pickle_module``."""

    def __init__(self, unpickler: type) -> None:
        self.Unpickler = unpickler
        self.__name__ = 'mmsafe.checkpoint.weights_unpickler'

    def load(self, file, **kwargs) -> Any:
        return self.Unpickler(file, **kwargs).load()


def pickle_module(allowed: Dict[str, Any]) -> _PickleModule:
    """A ``pickle_module`` for ``torch.load`` that rebuilds only ``allowed``
    (dotted name -> object)."""
    unpickler = type('WeightsOnlyUnpickler', (WeightsOnlyUnpickler, ),
                     dict(allowed=dict(allowed)))
    return _PickleModule(unpickler)


def _codecs_encode(text: Any, encoding: str = 'utf-8') -> bytes:
    """Stand-in for ``_codecs.encode``, which protocol 2 pickles use for
    ``bytes``: text to bytes in latin1/utf-8 only."""
    if not isinstance(text, str) or encoding not in ('latin1', 'latin-1',
                                                     'utf-8', 'utf8'):
        raise _REFUSE('_codecs.encode is allowed only for str in latin1 or '
                      'utf-8 while loading a checkpoint')
    return text.encode(encoding)


@functools.lru_cache(maxsize=None)
def base_allowlist() -> Dict[str, Any]:
    """torch's own weights-only allowlist, with what newer torch adds to it
    (every dtype, ``torch.device``, ``Counter``, sets, ``bytes`` pickled by
    protocol 2). Built once; :func:`allowlist` copies it."""
    allowed: Dict[str, Any] = {}
    try:
        from torch._weights_only_unpickler import _get_allowed_globals
        allowed.update(_get_allowed_globals())
    except ImportError:  # pragma: no cover - every supported torch has it
        pass
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            allowed[f'torch.{name}'] = value
    allowed.update({
        'torch.device': torch.device,
        'torch.Size': torch.Size,
        'collections.OrderedDict': collections.OrderedDict,
        'collections.Counter': collections.Counter,
        'builtins.set': set,
        'builtins.frozenset': frozenset,
        'builtins.bytearray': bytearray,
        '_codecs.encode': _codecs_encode,
    })
    return allowed


def allowlist(items: Iterable[Any]) -> Dict[str, Any]:
    """:func:`base_allowlist` plus ``items``: objects (allowed under their
    own dotted name) or ``(object, dotted name)`` pairs."""
    allowed = dict(base_allowlist())
    for item in items:
        if isinstance(item, tuple):
            obj, name = item
        else:
            obj = item
            name = f'{obj.__module__}.{obj.__qualname__}'
        allowed[name] = obj
    return allowed

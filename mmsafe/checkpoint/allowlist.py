"""The allowlist of the checkpoint unpickler: what MMEngine and MMDetection
checkpoints hold, each with the check of its arguments.

========================================  ================================
global                                    accepted
========================================  ================================
``torch._utils._rebuild_tensor_v2/v3``    a view of a storage record
``torch._utils._rebuild_parameter``       a Parameter of such a tensor
storage classes (``torch.FloatStorage``)  in persistent ids only
dtypes (``torch.float32`` ...)            as values
``torch.device``, ``torch.Size``          a device name / integer sizes
``collections.OrderedDict``               empty, then items; ``BUILD`` of
                                          ``_metadata`` only (state dicts)
``collections.Counter``                   a dict of plain keys to numbers
``builtins.set`` / ``frozenset``          plain items
``builtins.bytes`` / ``bytearray``        from bytes or a latin-1 string,
                                          never from a size
``_codecs.encode``                        a string to latin-1/UTF-8 bytes
``builtins.complex``                      two numbers
numpy dtype / array / scalar              plain data (:mod:`.numpy_data`)
``mmengine...HistoryBuffer``, ``getattr``  :mod:`.history_buffer`
========================================  ================================

``NEWOBJ`` creates only a ``HistoryBuffer`` (and a trusted class);
``BUILD`` applies only to an object this load made for it, once, with the
state its own pickling writes. What the allowlist does not know it asks
the load's :class:`~.trust.TrustedObjects` (the opt-in), then refuses.
"""
import collections
import re
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from .container import CheckpointArchive
from .errors import CheckpointFormatError, UntrustedCheckpointError
from .history_buffer import HistoryBufferObjects
from .numpy_data import NumpyObjects
from .tensors import TorchObjects
from .tokens import Token, describe, expect_args, refuse
from .trust import TrustedObjects
from .unpickler import Rules, check_key

_TEXT_ENCODINGS = ('latin1', 'latin-1', 'utf-8', 'utf8')
#: names of tensor dtypes that newer torch adds (uint16, float8_e4m3fn ...)
_NEWER_DTYPE = re.compile(r'(u?int[0-9]+|float[0-9]+(_[a-z0-9]+)*|'
                          r'bits[0-9a-z_]+|complex[0-9]+)$')


def _plain_items(value: Any, what: str) -> list:
    if type(value) not in (list, tuple, set, frozenset):
        raise refuse(f'{what} of a {type(value).__qualname__}')
    for item in value:
        check_key(item)
    return list(value)


def _number(value: Any, what: str) -> Any:
    if type(value) not in (int, float, bool):
        raise refuse(f'{what} must be a number, not '
                     f'{type(value).__qualname__}')
    return value


class CheckpointRules(Rules):
    """The rules of one load.

    Args:
        archive (CheckpointArchive): the file's checked records.
        map_location: as ``torch.load``'s.
        trust (TrustedObjects, optional): the opted-in classes and
            functions of this load; none by default.
        torch_objects (TorchObjects, optional): the storages and tensors
            of another container (the legacy format); by default those of
            ``archive``.
    """

    def __init__(self, archive: Optional[CheckpointArchive],
                 map_location: Any, trust: Optional[TrustedObjects] = None,
                 torch_objects: Optional[TorchObjects] = None):
        self.trust = trust or TrustedObjects()
        #: id -> (object, builder): made by this load, awaiting BUILD
        self.pending: Dict[int, Tuple[Any, Callable[[Any, Any], None]]] = {}
        #: id -> object: built by this load
        self.built: Dict[int, Any] = {}
        self.torch = torch_objects or TorchObjects(archive, map_location)
        self.numpy = NumpyObjects(self.expect_build)
        self.history = HistoryBufferObjects(self.expect_build)
        self.globals: Dict[str, Any] = {
            **self._builtin_globals(), **self.torch.globals(),
            **self.numpy.globals(), **self.history.globals()}

    def expect_build(self, obj: Any, builder: Callable[[Any, Any],
                                                       None]) -> None:
        self.pending[id(obj)] = (obj, builder)

    # ---------------------------------------------------------- Rules --
    def find_global(self, module: str, name: str) -> Any:
        full = f'{module}.{name}'
        if full in self.globals:
            return self.globals[full]
        trusted = self.trust.find(full)
        if trusted is not None:
            return trusted
        if module == 'torch' and _NEWER_DTYPE.match(name):
            raise CheckpointFormatError(
                f'it holds tensors of dtype torch.{name}, which this torch '
                f'({torch.__version__}) does not have: load it with a newer '
                'torch, or re-save it with another dtype', damaged=False)
        raise UntrustedCheckpointError(
            f'it holds the pickled object `{full}`, which MMEngine/'
            'MMDetection checkpoints do not need', global_name=full)

    def call(self, func: Any, args: tuple) -> Any:
        if isinstance(func, Token) and func.call is not None:
            return func.call(args)
        if self.trust.trusts(func):
            return self.trust.call(func, args)
        raise UntrustedCheckpointError(
            f'it calls {describe(func)}, which is not an allowed function')

    def new(self, cls: Any, args: tuple) -> Any:
        if isinstance(cls, Token) and cls.new is not None:
            return cls.new(args)
        if isinstance(cls, type) and self.trust.trusts(cls):
            return self.trust.new(cls, args)
        raise UntrustedCheckpointError(
            f'it creates an object of {describe(cls)} (NEWOBJ), which only '
            "MMEngine's HistoryBuffer needs")

    def build(self, obj: Any, state: Any) -> None:
        entry = self.pending.pop(id(obj), None)
        if entry is not None and entry[0] is obj:
            entry[1](obj, state)
            self.built[id(obj)] = obj
            return
        if self.trust.made_by_trusted_class(obj):
            self.trust.build(obj, state)
            return
        raise UntrustedCheckpointError(
            f'it sets the state of {_what(obj)} (BUILD), which its own '
            'pickling does not do')

    def persistent_load(self, pid: Any) -> Any:
        return self.torch.persistent_load(pid)

    def container_add(self, container: Any) -> Callable[[Any, Any], None]:
        if self.trust.made_by_trusted_class(container):
            return self.trust.container_add(container)
        return super().container_add(container)

    def finish(self) -> None:
        """After the pickle: every storage record was used."""
        unused = self.torch.unused_records()
        if unused:
            raise CheckpointFormatError(
                f'it has storage records that its pickle never uses: '
                f'{unused[:5]}')

    # ------------------------------------------------------- builtins --
    def _builtin_globals(self) -> Dict[str, Any]:
        handlers = {
            'builtins.set': lambda a: set(self._items('set', a)),
            'builtins.frozenset':
                lambda a: frozenset(self._items('frozenset', a)),
            'builtins.bytes': self._bytes,
            'builtins.bytearray': self._bytearray,
            'builtins.complex': self._complex,
            '_codecs.encode': self._encode,
            'collections.OrderedDict': self._ordered_dict,
            'collections.Counter': self._counter,
        }
        return {name: Token(name, call=call)
                for name, call in handlers.items()}

    @staticmethod
    def _items(name: str, args: tuple) -> list:
        expect_args(name, args, 0, 1)
        return _plain_items(args[0], name) if args else []

    @staticmethod
    def _bytes(args: tuple) -> bytes:
        expect_args('bytes', args, 0)
        return b''

    @staticmethod
    def _bytearray(args: tuple) -> bytearray:
        expect_args('bytearray', args, 0, 1, 2)
        if not args:
            return bytearray()
        if len(args) == 1 and type(args[0]) is bytes:
            return bytearray(args[0])
        if len(args) == 2 and type(args[0]) is str and \
                type(args[1]) is str and args[1] in ('latin1', 'latin-1'):
            return bytearray(args[0], 'latin-1')
        raise refuse('bytearray of something other than bytes or a latin-1 '
                     'string (never of a size)')

    @staticmethod
    def _complex(args: tuple) -> complex:
        expect_args('complex', args, 2)
        return complex(_number(args[0], 'complex'),
                       _number(args[1], 'complex'))

    @staticmethod
    def _encode(args: tuple) -> bytes:
        expect_args('_codecs.encode', args, 1, 2)
        text = args[0]
        encoding = args[1] if len(args) == 2 else 'utf-8'
        if type(text) is not str or type(encoding) is not str or \
                encoding not in _TEXT_ENCODINGS:
            raise refuse('_codecs.encode of something other than a string '
                         'to latin-1 or UTF-8')
        try:
            return text.encode(encoding, 'surrogatepass'
                               if encoding.startswith('utf') else 'strict')
        except UnicodeEncodeError as err:
            raise CheckpointFormatError(
                f'bytes pickled as a {encoding} string that does not encode '
                f'({err})') from err

    def _ordered_dict(self, args: tuple) -> collections.OrderedDict:
        expect_args('collections.OrderedDict', args, 0)
        result: collections.OrderedDict = collections.OrderedDict()
        self.expect_build(result, _build_ordered_dict)
        return result

    @staticmethod
    def _counter(args: tuple) -> collections.Counter:
        expect_args('collections.Counter', args, 0, 1)
        if not args:
            return collections.Counter()
        counts = args[0]
        if type(counts) is not dict:
            raise refuse('Counter of something other than a dict')
        for key, value in counts.items():
            check_key(key)
            _number(value, 'a Counter count')
        return collections.Counter(counts)


def _build_ordered_dict(result: collections.OrderedDict, state: Any) -> None:
    """``torch.nn.Module.state_dict()`` keeps ``_metadata`` (the version of
    each module) as an attribute of its OrderedDict; nothing else."""
    if type(state) is not dict or len(state) != 1 or \
            '_metadata' not in state or \
            type(state['_metadata']) not in (dict, collections.OrderedDict):
        raise refuse('an OrderedDict state other than a state dict\'s '
                     '_metadata (an attribute could shadow a method such as '
                     'items or copy)')
    vars(result)['_metadata'] = state['_metadata']


def _what(obj: Any) -> str:
    kind = type(obj)
    if isinstance(obj, Token):
        return repr(obj)
    if isinstance(obj, type):
        return f'the class {obj.__module__}.{obj.__qualname__}'
    return f'a {kind.__module__}.{kind.__qualname__}'

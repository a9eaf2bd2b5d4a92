"""A minimal unpickler for checkpoints.

It knows the pickle opcodes that ``torch.save`` (protocol 2) and newer
protocols use for plain data: numbers, strings, bytes, lists, tuples,
dicts, sets, the memo, ``GLOBAL``/``STACK_GLOBAL``, ``REDUCE``, ``BUILD``,
``NEWOBJ`` and ``BINPERSID``. Every other opcode is refused, among them
``NEWOBJ_EX`` (keyword arguments), ``INST``/``OBJ``, the copyreg extension
registry and out-of-band buffers. It never imports, looks up or calls
anything itself: a global, a call, an object creation, a ``BUILD`` and a
persistent id all go to a :class:`Rules` object, which holds the
allowlist (:class:`~.allowlist.CheckpointRules`).

Bounds it keeps on its own:

* dict keys and set items are strings, bytes, bools, None or ints below
  the hash modulus: keys whose hashing costs more than their size (nested
  tuples that share their items through the memo) or that collide on
  purpose (crafted ints and floats) are refused;
* ``APPEND``/``SETITEM``/``ADDITEMS`` reach only lists, dicts and sets
  (never a method of another object);
* a name in a ``GLOBAL`` is at most :data:`MAX_NAME` characters; a
  ``LONG4`` integer at most :data:`MAX_LONG_BYTES` bytes;
* the pickle must end with ``STOP`` on an empty stack, with no bytes after.

Its loop is iterative: the depth of nesting in a pickle costs no Python
recursion here (:mod:`.plain_data` bounds the depth of the result).
"""
import _compat_pickle
import collections
import pickletools
import struct
from typing import Any, Callable, Dict, List

from mmsafe.errors import MMSafeNotImplementedError
from .errors import CheckpointFormatError, UntrustedCheckpointError

MAX_NAME = 256
MAX_LONG_BYTES = 1024
#: ints hash to themselves below the modulus of Python's numeric hash
MAX_INT_KEY = (1 << 61) - 2

_OPCODE_NAMES = {op.code.encode('latin-1')[0]: op.name
                 for op in pickletools.opcodes}


class Rules:
    """What a :class:`CheckpointUnpickler` asks about objects (the
    allowlist). Every method raises
    :class:`~.errors.UntrustedCheckpointError` to refuse."""

    def find_global(self, module: str, name: str) -> Any:
        """The object a ``GLOBAL`` names: a token of an allowed callable or
        class, or a plain value (a dtype)."""
        raise MMSafeNotImplementedError

    def call(self, func: Any, args: tuple) -> Any:
        """``REDUCE``: ``func(*args)``, checked."""
        raise MMSafeNotImplementedError

    def new(self, cls: Any, args: tuple) -> Any:
        """``NEWOBJ``: ``cls.__new__(cls, *args)``, checked."""
        raise MMSafeNotImplementedError

    def build(self, obj: Any, state: Any) -> None:
        """``BUILD``: set the state of ``obj`` (made by this load)."""
        raise MMSafeNotImplementedError

    def persistent_load(self, pid: Any) -> Any:
        """``BINPERSID``: the storage a persistent id names."""
        raise MMSafeNotImplementedError

    def container_add(self, container: Any) -> Callable[[Any, Any], None]:
        """How ``SETITEM(S)``/``APPEND(S)`` add to ``container`` that is not
        a list or a dict (an instance of a trusted class); refuses by
        default."""
        raise UntrustedCheckpointError(
            f'adding items to a {type(container).__qualname__} is not '
            'allowed while loading a checkpoint')


def check_key(key: Any) -> None:
    """Refuse a dict key or set item whose hashing is not cheap and
    collision-free: only str, bytes, bool, None and small ints."""
    kind = type(key)
    if kind is str or kind is bytes or kind is bool or key is None:
        return
    if kind is int and -MAX_INT_KEY <= key <= MAX_INT_KEY:
        return
    what = 'an integer beyond the hash modulus' if kind is int else \
        f'of type {kind.__qualname__}'
    raise UntrustedCheckpointError(
        f'a dict key or set item {what}: checkpoints use strings and small '
        'integers as keys, and hashing other keys can take unbounded time')


class _Stop(Exception):
    """Raised by ``STOP`` with the result."""

    def __init__(self, value: Any):
        super().__init__()
        self.value = value


_Handler = Callable[['CheckpointUnpickler'], None]


def _unicode(width: int) -> _Handler:
    def load(self: 'CheckpointUnpickler') -> None:
        self._push(self._text(self._read(self._read_uint(width))))
    return load


def _bytes(width: int, kind: type = bytes) -> _Handler:
    def load(self: 'CheckpointUnpickler') -> None:
        self._push(kind(self._read(self._read_uint(width))))
    return load


def _tuple_n(size: int) -> _Handler:
    def load(self: 'CheckpointUnpickler') -> None:
        if len(self.stack) < size:
            raise CheckpointFormatError(
                f'TUPLE{size} on a stack of {len(self.stack)} items')
        items = tuple(self.stack[-size:])
        del self.stack[-size:]
        self._push(items)
    return load


def _put(width: int) -> _Handler:
    def load(self: 'CheckpointUnpickler') -> None:
        self.memo[self._read_uint(width)] = self._top()
    return load


def _get(width: int) -> _Handler:
    def load(self: 'CheckpointUnpickler') -> None:
        index = self._read_uint(width)
        if index not in self.memo:
            raise CheckpointFormatError(
                f'the pickle reads memo entry {index}, which it never wrote')
        self._push(self.memo[index])
    return load


class CheckpointUnpickler:
    """Unpickle ``data`` (the whole pickle) under ``rules``.

    Args:
        data (bytes): the pickle, e.g. a checkpoint's ``data.pkl``.
        rules (Rules): the allowlist.
        start (int): where the pickle starts in ``data``.
        to_end (bool): the pickle must end where ``data`` ends; else
            :attr:`pos` is where it ended (a file of several pickles).
    """

    def __init__(self, data: bytes, rules: Rules, start: int = 0,
                 to_end: bool = True):
        self.data = bytes(data)
        self.rules = rules
        self.to_end = to_end
        self.pos = start
        self.proto = 0
        self.stack: List[Any] = []
        self.metastack: List[List[Any]] = []
        self.memo: Dict[int, Any] = {}

    # ----------------------------------------------------------- driver --
    def load(self) -> Any:
        """The unpickled object.

        Raises:
            UntrustedCheckpointError: an opcode or object outside the
                allowlist.
            CheckpointFormatError: the pickle is malformed or truncated.
        """
        data, dispatch = self.data, self.DISPATCH
        end = len(data)
        try:
            while self.pos < end:
                code = data[self.pos]
                self.pos += 1
                handler = dispatch.get(code)
                if handler is None:
                    name = _OPCODE_NAMES.get(code)
                    if name is None:
                        raise CheckpointFormatError(
                            f'byte {code:#04x} at offset {self.pos - 1} of '
                            'the pickle is not a pickle opcode')
                    raise UntrustedCheckpointError(
                        f'the pickle opcode {name} (offset {self.pos - 1}) '
                        'is not allowed while loading a checkpoint: '
                        'checkpoints need only the opcodes of plain data')
                handler(self)
        except _Stop as stop:
            if self.to_end and self.pos != end:
                raise CheckpointFormatError(
                    f'{end - self.pos} bytes follow the end of the pickle')
            return stop.value
        raise CheckpointFormatError('the pickle ends without STOP '
                                    '(truncated)')

    # ---------------------------------------------------------- helpers --
    def _read(self, size: int) -> bytes:
        start = self.pos
        stop = start + size
        if size < 0 or stop > len(self.data):
            raise CheckpointFormatError(
                f'the pickle is truncated (offset {start} needs {size} '
                'bytes)')
        self.pos = stop
        return self.data[start:stop]

    def _read_uint(self, size: int) -> int:
        return int.from_bytes(self._read(size), 'little')

    def _readline(self) -> str:
        stop = self.data.find(b'\n', self.pos, self.pos + MAX_NAME + 1)
        if stop < 0:
            raise UntrustedCheckpointError(
                f'a global name at offset {self.pos} is longer than '
                f'{MAX_NAME} characters or unterminated')
        line = self.data[self.pos:stop]
        self.pos = stop + 1
        try:
            return line.decode('utf-8')
        except UnicodeDecodeError as err:
            raise CheckpointFormatError(
                f'a global name at offset {self.pos} is not UTF-8') from err

    def _text(self, raw: bytes) -> str:
        try:
            return raw.decode('utf-8', 'surrogatepass')
        except UnicodeDecodeError as err:
            raise CheckpointFormatError(
                f'a string before offset {self.pos} is not UTF-8') from err

    def _pop(self) -> Any:
        if not self.stack:
            raise CheckpointFormatError(
                f'the pickle pops an empty stack (offset {self.pos - 1})')
        return self.stack.pop()

    def _top(self) -> Any:
        if not self.stack:
            raise CheckpointFormatError(
                f'the pickle reads an empty stack (offset {self.pos - 1})')
        return self.stack[-1]

    def _pop_mark(self) -> List[Any]:
        if not self.metastack:
            raise CheckpointFormatError(
                f'the pickle has no MARK to pop (offset {self.pos - 1})')
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def _push(self, value: Any) -> None:
        self.stack.append(value)

    # ------------------------------------------------------------ opcodes --
    def _proto(self) -> None:
        proto = self._read(1)[0]
        if not 2 <= proto <= 5:
            raise CheckpointFormatError(f'pickle protocol {proto} is not '
                                        'one that torch.save writes (2-5)')
        self.proto = proto

    def _frame(self) -> None:
        size = self._read_uint(8)
        if size > len(self.data) - self.pos:
            raise CheckpointFormatError('a pickle frame reaches past the end')

    def _stop(self) -> None:
        value = self._pop()
        if self.stack or self.metastack:
            raise CheckpointFormatError(
                'the pickle stops with objects left on its stack')
        raise _Stop(value)

    def _none(self) -> None:
        self._push(None)

    def _true(self) -> None:
        self._push(True)

    def _false(self) -> None:
        self._push(False)

    def _binint(self) -> None:
        self._push(int.from_bytes(self._read(4), 'little', signed=True))

    def _binint1(self) -> None:
        self._push(self._read(1)[0])

    def _binint2(self) -> None:
        self._push(self._read_uint(2))

    def _long1(self) -> None:
        size = self._read(1)[0]
        self._push(int.from_bytes(self._read(size), 'little', signed=True))

    def _long4(self) -> None:
        size = int.from_bytes(self._read(4), 'little', signed=True)
        if not 0 <= size <= MAX_LONG_BYTES:
            raise UntrustedCheckpointError(
                f'an integer of {size} bytes (at most {MAX_LONG_BYTES})')
        self._push(int.from_bytes(self._read(size), 'little', signed=True))

    def _binfloat(self) -> None:
        self._push(struct.unpack('>d', self._read(8))[0])

    def _empty_list(self) -> None:
        self._push([])

    def _empty_dict(self) -> None:
        self._push({})

    def _empty_tuple(self) -> None:
        self._push(())

    def _empty_set(self) -> None:
        self._push(set())

    def _mark(self) -> None:
        self.metastack.append(self.stack)
        self.stack = []

    def _tuple(self) -> None:
        self._push(tuple(self._pop_mark()))

    def _list(self) -> None:
        self._push(self._pop_mark())

    def _dict(self) -> None:
        items = self._pop_mark()
        result: Dict[Any, Any] = {}
        self._set_items(result, items)
        self._push(result)

    def _frozenset(self) -> None:
        items = self._pop_mark()
        for item in items:
            check_key(item)
        self._push(frozenset(items))

    def _append(self) -> None:
        value = self._pop()
        self._extend(self._top(), [value])

    def _appends(self) -> None:
        items = self._pop_mark()
        self._extend(self._top(), items)

    def _extend(self, target: Any, items: List[Any]) -> None:
        if type(target) is list:
            target.extend(items)
            return
        add = self.rules.container_add(target)
        for item in items:
            add(None, item)

    def _setitem(self) -> None:
        value = self._pop()
        key = self._pop()
        self._set_items(self._top(), [key, value])

    def _setitems(self) -> None:
        items = self._pop_mark()
        self._set_items(self._top(), items)

    def _set_items(self, target: Any, items: List[Any]) -> None:
        if len(items) % 2:
            raise CheckpointFormatError('SETITEMS with an odd number of '
                                        'items')
        if type(target) is dict or type(target) is collections.OrderedDict:
            for i in range(0, len(items), 2):
                check_key(items[i])
                target[items[i]] = items[i + 1]
            return
        add = self.rules.container_add(target)
        for i in range(0, len(items), 2):
            check_key(items[i])
            add(items[i], items[i + 1])

    def _additems(self) -> None:
        items = self._pop_mark()
        target = self._top()
        if type(target) is not set:
            raise UntrustedCheckpointError(
                f'ADDITEMS on a {type(target).__qualname__}: only sets')
        for item in items:
            check_key(item)
        target.update(items)

    def _pop_op(self) -> None:
        if self.stack:
            self.stack.pop()
        else:
            self._pop_mark()

    def _pop_mark_op(self) -> None:
        self._pop_mark()

    def _dup(self) -> None:
        self._push(self._top())

    def _memoize(self) -> None:
        self.memo[len(self.memo)] = self._top()

    def _global(self) -> None:
        module = self._readline()
        name = self._readline()
        self._push(self._find(module, name))

    def _stack_global(self) -> None:
        name = self._pop()
        module = self._pop()
        if type(module) is not str or type(name) is not str:
            raise UntrustedCheckpointError('STACK_GLOBAL with a module or '
                                           'name that is not a string')
        if len(module) + len(name) > 2 * MAX_NAME:
            raise UntrustedCheckpointError('a global name longer than '
                                           f'{MAX_NAME} characters')
        self._push(self._find(module, name))

    def _find(self, module: str, name: str) -> Any:
        if self.proto < 3:
            # protocol 2 writes Python 2's module names (__builtin__ ...)
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            else:
                module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        return self.rules.find_global(module, name)

    def _reduce(self) -> None:
        args = self._pop()
        func = self._top()
        if type(args) is not tuple:
            raise UntrustedCheckpointError(
                f'REDUCE with arguments of type {type(args).__qualname__}')
        self.stack[-1] = self.rules.call(func, args)

    def _build(self) -> None:
        state = self._pop()
        self.rules.build(self._top(), state)

    def _newobj(self) -> None:
        args = self._pop()
        cls = self._pop()
        if type(args) is not tuple:
            raise UntrustedCheckpointError(
                f'NEWOBJ with arguments of type {type(args).__qualname__}')
        self._push(self.rules.new(cls, args))

    def _binpersid(self) -> None:
        self._push(self.rules.persistent_load(self._pop()))

    DISPATCH: Dict[int, _Handler] = {
        op[0]: handler for op, handler in [
            (b'\x80', _proto), (b'\x95', _frame), (b'.', _stop),
            (b'N', _none), (b'\x88', _true), (b'\x89', _false),
            (b'J', _binint), (b'K', _binint1), (b'M', _binint2),
            (b'\x8a', _long1), (b'\x8b', _long4), (b'G', _binfloat),
            (b'X', _unicode(4)), (b'\x8c', _unicode(1)),
            (b'\x8d', _unicode(8)),
            (b'B', _bytes(4)), (b'C', _bytes(1)), (b'\x8e', _bytes(8)),
            (b'\x96', _bytes(8, bytearray)),
            (b']', _empty_list), (b'}', _empty_dict),
            (b')', _empty_tuple), (b'\x8f', _empty_set),
            (b'(', _mark), (b't', _tuple), (b'\x85', _tuple_n(1)),
            (b'\x86', _tuple_n(2)), (b'\x87', _tuple_n(3)),
            (b'l', _list), (b'd', _dict), (b'\x91', _frozenset),
            (b'a', _append), (b'e', _appends), (b's', _setitem),
            (b'u', _setitems), (b'\x90', _additems),
            (b'0', _pop_op), (b'1', _pop_mark_op), (b'2', _dup),
            (b'q', _put(1)), (b'r', _put(4)),
            (b'\x94', _memoize), (b'h', _get(1)), (b'j', _get(4)),
            (b'c', _global), (b'\x93', _stack_global),
            (b'R', _reduce), (b'b', _build), (b'\x81', _newobj),
            (b'Q', _binpersid),
        ]
    }

"""What the checkpoint unpickler holds for an allowed global.

A ``GLOBAL`` of a checkpoint never yields the object it names: it yields a
:class:`Token` that carries the checked handlers of that object (its call,
its creation), so nothing a file names can be called except through the
check written for it, and a token that ends up in the loaded data is
refused as non-data (:mod:`.plain_data`).
"""
from typing import Any, Callable, Optional

from .errors import UntrustedCheckpointError


class Token:
    """An allowed global.

    Args:
        name (str): its dotted name, as pickles write it.
        call (Callable, optional): ``REDUCE``: takes the argument tuple,
            checks it and returns the result.
        new (Callable, optional): ``NEWOBJ``: takes the argument tuple.
        dtype (optional): the dtype of a storage class.
    """

    __slots__ = ('name', 'call', 'new', 'dtype')

    def __init__(self, name: str, call: Optional[Callable] = None,
                 new: Optional[Callable] = None, dtype: Any = None):
        self.name = name
        self.call = call
        self.new = new
        self.dtype = dtype

    def __repr__(self) -> str:
        return f'<{self.name}>'


def describe(value: Any, depth: int = 0) -> str:
    """A short account of a value a pickle made, for an error message,
    that runs none of its code: plain values shortly, tuples item by item,
    anything else by its type (a tensor's repr may import modules and print
    megabytes)."""
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return repr(value)
    if kind is int:
        return repr(value) if value.bit_length() < 64 else \
            f'an integer of {value.bit_length()} bits'
    if kind is str or kind is bytes:
        text = repr(value[:40])
        return text if len(value) <= 40 else text + '...'
    if isinstance(value, Token):
        return repr(value)
    if kind is tuple and depth < 2:
        items = [describe(item, depth + 1) for item in value[:6]]
        more = ', ...' if len(value) > 6 else ''
        return '(' + ', '.join(items) + more + ')'
    return f'a {kind.__module__}.{kind.__qualname__}'


def refuse(what: str) -> UntrustedCheckpointError:
    """The error for a call or state outside what checkpoints use."""
    return UntrustedCheckpointError(what)


def expect_args(name: str, args: tuple, *counts: int) -> None:
    """Refuse a call of ``name`` with a number of arguments not in
    ``counts``."""
    if len(args) not in counts:
        raise refuse(f'{name} called with {len(args)} arguments '
                     f'(checkpoints pass {" or ".join(map(str, counts))})')


def exact_int(value: Any, what: str, low: int = 0,
              high: int = (1 << 62)) -> int:
    """``value`` when it is an int (not a bool) in ``[low, high]``."""
    if type(value) is not int or not low <= value <= high:
        raise refuse(f'{what} must be an integer in [{low}, {high}], not '
                     f'{describe(value)}')
    return value


def exact_bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise refuse(f'{what} must be True or False, not '
                     f'{type(value).__qualname__}')
    return value

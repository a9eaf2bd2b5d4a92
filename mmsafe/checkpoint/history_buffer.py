"""MMEngine's message hub buffers, rebuilt from plain data.

MMEngine pickles a ``HistoryBuffer`` (``message_hub.log_scalars``) as
``NEWOBJ`` of the class, then ``BUILD`` with its ``__dict__``: ``max_length``,
``_log_history``, ``_count_history`` (numpy arrays) and
``statistics_methods``, the class's table of statistics, written as
``getattr(HistoryBuffer, 'mean')`` for each. Its ``__setstate__`` copies
that table into the class, so a file could change the statistics of every
buffer of the process, even when the load is then refused.

:class:`HistoryBufferObjects` never calls ``__setstate__`` and never writes
the class's table: a buffer is rebuilt by ``HistoryBuffer.__init__`` from
its checked fields (two one-dimensional numeric arrays of equal length,
at most ``max_length``). The statistics the file names must be ones this
process has registered under the same name (``min``, ``max``, ``current``,
``mean`` and those of ``HistoryBuffer.register_statistics``, a custom one
named by its function when that is a trusted global); they are checked,
not copied. The only class-level effect is MMEngine's own, that of
every new buffer: ``HistoryBuffer.__init__`` registers the four built-in
statistics if the process has not yet (``dict.setdefault``; a resumed run
needs them, and no name or object of the file reaches that table).

The ``getattr`` of those pickles is a stand-in that resolves only
``(HistoryBuffer, <registered statistic>)``, to a marker that only a
buffer's ``BUILD`` accepts.
"""
from typing import Any, Callable, Dict, FrozenSet

import numpy as np

from .tokens import Token, describe, exact_int, expect_args, refuse

BUILT_IN_STATISTICS = ('min', 'max', 'current', 'mean')
_FIELDS = frozenset({'max_length', '_log_history', '_count_history'})
_STATE_KEYS = _FIELDS | {'statistics_methods'}


class StatisticsMethod:
    """What ``getattr(HistoryBuffer, name)`` gives while loading."""

    __slots__ = ('name', )

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f'<HistoryBuffer.{self.name}>'


def registered_statistics() -> Dict[str, Any]:
    """The statistics registered in this process (a copy of the table)."""
    from mmengine.logging import HistoryBuffer
    return dict(HistoryBuffer._statistics_methods)


def statistic_names() -> FrozenSet[str]:
    """The statistics a buffer of this process can compute."""
    known = set(BUILT_IN_STATISTICS) | set(registered_statistics())
    return frozenset(name for name in known if not name.startswith('_'))


def _history(value: Any, what: str) -> np.ndarray:
    if type(value) is not np.ndarray or value.ndim != 1 or \
            value.dtype.kind not in 'biuf':
        raise refuse(f'a HistoryBuffer whose {what} is not a one-dimensional '
                     'numeric numpy array')
    return value


class HistoryBufferObjects:
    """The message hub part of the checkpoint allowlist, for one load.

    Args:
        expect_build (Callable): registers an object made by this load
            with the function that may ``BUILD`` it (once).
    """

    def __init__(self, expect_build: Callable[[Any, Callable], None]):
        from mmengine.logging import HistoryBuffer
        self.cls = HistoryBuffer
        self.expect_build = expect_build
        self.name = f'{HistoryBuffer.__module__}.{HistoryBuffer.__qualname__}'
        self.token = Token(self.name, new=self.new)

    def globals(self) -> Dict[str, Any]:
        found: Dict[str, Any] = {
            self.name: self.token,
            'builtins.getattr': Token('builtins.getattr',
                                      call=self.getattr)}
        # protocol >= 4 names a method by its qualified name
        for name in statistic_names():
            found[f'{self.name}.{name}'] = StatisticsMethod(name)
        return found

    def getattr(self, args: tuple) -> StatisticsMethod:
        expect_args('getattr', args, 2)
        owner, name = args
        if owner is not self.token or type(name) is not str or \
                name not in statistic_names():
            raise refuse(
                f'getattr({describe(owner)}, {describe(name)}) is not allowed '
                'while loading a checkpoint: only the statistics methods of '
                'mmengine.logging.HistoryBuffer resolve')
        return StatisticsMethod(name)

    def new(self, args: tuple) -> Any:
        if args:
            raise refuse('HistoryBuffer created with arguments')
        buffer = self.cls.__new__(self.cls)
        self.expect_build(buffer, self.build)
        return buffer

    def build(self, buffer: Any, state: Any) -> None:
        if type(state) is not dict or not all(
                type(key) is str for key in state) or \
                not _FIELDS <= set(state) <= _STATE_KEYS:
            raise refuse('a HistoryBuffer state other than max_length, '
                         '_log_history, _count_history and '
                         'statistics_methods')
        max_length = exact_int(state['max_length'], 'max_length', 1)
        logs = _history(state['_log_history'], '_log_history')
        counts = _history(state['_count_history'], '_count_history')
        if len(logs) != len(counts) or len(logs) > max_length:
            raise refuse(f'a HistoryBuffer of {len(logs)} values and '
                         f'{len(counts)} counts (max_length {max_length})')
        methods = state.get('statistics_methods', {})
        registered = registered_statistics()
        if type(methods) is not dict or not all(
                type(key) is str and (
                    type(value) is StatisticsMethod and value.name == key
                    or key in registered and value is registered[key])
                for key, value in methods.items()):
            raise refuse('HistoryBuffer statistics_methods other than the '
                         'statistics this process has registered, by their '
                         'names')
        self.cls.__init__(buffer, logs, counts, max_length)

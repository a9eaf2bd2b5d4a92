"""What a loaded checkpoint may be: plain data, bounded.

:func:`check_plain_data` walks the loaded object once (no recursion) and
refuses:

* anything but plain data: None, bools, numbers, strings, bytes, tensors
  and Parameters (exact types), ``torch.dtype``/``torch.device``/
  ``torch.Size``, numpy arrays, scalars and dtypes of plain data, and
  containers of those (dict, ``OrderedDict`` with at most its
  ``_metadata``, ``Counter``, list, tuple, set, frozenset), MMEngine's
  ``HistoryBuffer`` as this load rebuilt it, and instances of trusted
  classes (not walked). Tokens, storage references and statistics markers
  that a pickle left in the data are refused here;
* cycles (a list that holds itself);
* nesting deeper than :data:`MAX_DEPTH` (code that walks checkpoints
  recursively, such as ``copy.deepcopy`` in MMEngine's message hub, would
  hit Python's recursion limit);
* more nodes, counting an object once per reference, than
  :func:`node_budget` allows for the pickle's size: a few hundred bytes of
  memo references can make a list whose printout or copy never ends.
"""
import collections
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import numpy as np
import torch

from .errors import UntrustedCheckpointError
from .numpy_data import plain_dtype
from .tokens import describe
from .trust import TrustedObjects

MAX_DEPTH = 64
_LEAVES = frozenset({type(None), bool, int, float, complex, str, bytes,
                     bytearray, torch.dtype, torch.device, torch.Size,
                     torch.Tensor, torch.nn.Parameter})
_SEQUENCES = frozenset({list, tuple, set, frozenset})
_MAPPINGS = frozenset({dict, collections.Counter, collections.OrderedDict})


def node_budget(pickle_size: int) -> int:
    """How many nodes (counted per reference) the data of a pickle of
    ``pickle_size`` bytes may have: every reference costs a pickle at least
    one byte, so only shared subtrees exceed it."""
    return 16 * pickle_size + 100_000


#: where a node is: None for the top, else (parent's place, key, how)
Place = Optional[tuple]


def _where(place: Place) -> str:
    """``['meta']['seed']`` for a place (built only for an error)."""
    parts = []
    while place is not None:
        place, key, how = place
        parts.append(f'.{key}' if how == 'attr' else f'[{describe(key)}]')
    return ''.join(reversed(parts)) or 'the top'


def _refuse(what: str, place: Place) -> UntrustedCheckpointError:
    return UntrustedCheckpointError(f'{what} at {_where(place)}')


class _Walk:

    def __init__(self, history_types: Tuple[type, ...], built: Dict[int, Any],
                 trust: TrustedObjects):
        self.history_types = history_types
        self.built = built
        self.trust = trust

    def children(self, obj: Any, where: Place) -> Any:
        """The (place, child) pairs of a container; None for a leaf."""
        kind = type(obj)
        if kind in _LEAVES:
            return None
        if kind in _SEQUENCES:
            return (((where, i, 'item'), item) for i, item in enumerate(obj))
        if kind in _MAPPINGS:
            extra: Dict[str, Any] = vars(obj) \
                if kind is collections.OrderedDict else {}
            if set(extra) - {'_metadata'}:
                raise _refuse('an OrderedDict with attributes '
                              f'{sorted(extra)[:3]}', where)
            return self._items(obj, extra, where)
        if kind is np.ndarray or isinstance(obj, (np.generic, np.dtype)):
            dtype = obj if isinstance(obj, np.dtype) else obj.dtype
            if not plain_dtype(dtype):
                raise _refuse(f'numpy data of dtype {dtype}', where)
            return None
        if kind in self.history_types:
            if id(obj) not in self.built:
                raise _refuse('a HistoryBuffer that was never given its '
                              'state', where)
            return None
        if self.trust.holds(obj):
            return None
        raise _refuse(f'{describe(obj)}, which is not plain data', where)

    @staticmethod
    def _items(mapping: Any, extra: Dict[str, Any], where: Place
               ) -> Iterator[Tuple[Place, Any]]:
        for key, value in mapping.items():
            place = (where, key, 'item')
            yield place, key
            yield place, value
        for key, value in extra.items():
            yield (where, key, 'attr'), value


def check_plain_data(obj: Any, budget: int, history_types: Tuple[type, ...],
                     built: Dict[int, Any],
                     trust: Optional[TrustedObjects] = None) -> None:
    """Refuse ``obj`` unless it is plain data (see the module docstring).

    Args:
        obj: the loaded object.
        budget (int): the most nodes, counted per reference.
        history_types (tuple): MMEngine's ``HistoryBuffer`` class.
        built (dict): id -> object of what this load gave its state.
        trust (TrustedObjects, optional): what this load trusts (what it
            :meth:`~.trust.TrustedObjects.holds` is a leaf); none by
            default.

    Raises:
        UntrustedCheckpointError: what is refused, and where.
    """
    walk = _Walk(history_types, built, trust or TrustedObjects())
    weights: Dict[int, int] = {}
    on_path: Set[int] = set()
    root = walk.children(obj, None)
    if root is None:
        return
    # frames: [object, its (place, child) pairs, nodes so far, place]
    stack: List[list] = [[obj, iter(root), 1, None]]
    on_path.add(id(obj))
    while stack:
        frame = stack[-1]
        step = next(frame[1], None)
        if step is None:
            stack.pop()
            on_path.discard(id(frame[0]))
            weights[id(frame[0])] = frame[2]
            if stack:
                stack[-1][2] += frame[2]
                if stack[-1][2] > budget:
                    raise _refuse(f'more than {budget} nodes (objects shared '
                                  'through the memo, counted per '
                                  'reference)', stack[-1][3])
            continue
        place, child = step
        ident = id(child)
        if ident in on_path:
            raise _refuse('a container that holds itself (a cycle)', place)
        if ident in weights:
            frame[2] += weights[ident]
        else:
            kids = walk.children(child, place)
            if kids is None:
                weights[ident] = 1
                frame[2] += 1
            else:
                if len(stack) >= MAX_DEPTH:
                    raise _refuse(f'nesting deeper than {MAX_DEPTH} levels',
                                  place)
                on_path.add(ident)
                stack.append([child, kids, 1, place])
                continue
        if frame[2] > budget:
            raise _refuse(f'more than {budget} nodes (objects shared '
                          'through the memo, counted per reference)', place)

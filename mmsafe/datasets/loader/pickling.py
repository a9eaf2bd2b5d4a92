"""Find what a spawn-started DataLoader worker cannot receive.

Under the ``spawn`` and ``forkserver`` start methods each worker receives
the dataset, ``collate_fn`` and ``worker_init_fn`` pickled; an object that
cannot be pickled (a lambda, a local function, an open file) fails there
with a message that does not say where the object sits. The functions here
pickle the way ``multiprocessing`` does for spawn, without keeping the bytes,
and walk down to the innermost object that fails.
"""
import copyreg
import io
import pickle
import sys
from typing import Any, Iterable, Optional, Tuple

import torch

#: start methods that pickle the dataset into each worker
PICKLING_START_METHODS = ('spawn', 'forkserver')


class _NullSink(io.RawIOBase):
    """A write-only file that only counts bytes (pickling without keeping)."""

    def __init__(self):
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.size += len(b)
        return len(b)


def _stub():
    return None


class _SpawnLikePickler(pickle.Pickler):
    """Pickles like ``multiprocessing``'s ForkingPickler does for spawn.

    Tensors and plain arrays always travel to workers (torch moves them to
    shared memory), so they are replaced by a stub instead of being copied:
    the check stays cheap and has no side effects on the tensors.
    """

    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        from multiprocessing.reduction import ForkingPickler
        table = copyreg.dispatch_table.copy()
        table.update(ForkingPickler._extra_reducers)
        self.dispatch_table = table

    def reducer_override(self, obj):
        if isinstance(obj, (torch.Tensor, torch.UntypedStorage,
                            torch.TypedStorage)):
            return _stub, ()
        np = sys.modules.get('numpy')
        if np is not None and isinstance(obj, np.ndarray) and \
                obj.dtype != object:
            return _stub, ()
        return NotImplemented


def spawn_pickle_error(obj: Any) -> Optional[BaseException]:
    """Return the error pickling ``obj`` for a spawned worker, or None."""
    try:
        _SpawnLikePickler(_NullSink()).dump(obj)
    except RuntimeError as e:
        # Locks and queues refuse pickling outside of process start but are
        # legal while spawning ("through inheritance").
        if 'inheritance' in str(e):
            return None
        return e
    except Exception as e:  # noqa: BLE001  returned: it is the finding
        return e
    return None


def _children(obj: Any) -> Iterable[Tuple[str, Any]]:
    """Named children of ``obj`` in the order pickling would visit them."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f'[{key!r}]', value
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(obj):
            yield f'[{i}]', value
        return
    func = getattr(obj, 'func', None)
    if hasattr(obj, 'keywords') and callable(func):  # functools.partial
        yield '.func', func
        for i, value in enumerate(getattr(obj, 'args', ())):
            yield f'.args[{i}]', value
        for key, value in (getattr(obj, 'keywords', None) or {}).items():
            yield f'.keywords[{key!r}]', value
        return
    state = None
    getstate = getattr(type(obj), '__getstate__', None)
    if getstate is not None and getstate is not getattr(
            object, '__getstate__', None):
        try:
            state = obj.__getstate__()
        except Exception:  # noqa: BLE001  fall back to __dict__ below
            state = None
    if state is None:
        state = getattr(obj, '__dict__', None)
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
        state = {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, dict):
        for key, value in state.items():
            yield f'.{key}', value
    for slot in getattr(type(obj), '__slots__', ()) or ():
        if isinstance(slot, str) and hasattr(obj, slot):
            yield f'.{slot}', getattr(obj, slot)


def describe(obj: Any) -> str:
    """Short human name of an object: ``<lambda>``, ``<function f>``..."""
    name = getattr(obj, '__qualname__', None)
    if callable(obj) and name:
        module = getattr(obj, '__module__', None)
        kind = type(obj).__name__
        if name.endswith('<lambda>'):
            return f'<lambda> ({kind} defined in {module})'
        return f'<{kind} {module}.{name}>'
    text = repr(obj)
    if len(text) > 80:
        text = text[:77] + '...'
    return f'{type(obj).__name__} {text}'


def find_unpicklable(obj: Any, root: str = 'obj',
                     max_depth: int = 24) -> Optional[Tuple[str, str, str]]:
    """Name the innermost object that spawn cannot pickle.

    Walks containers, attributes (or ``__getstate__``), slots and
    ``functools.partial`` parts, following the first child that fails to
    pickle, until no child fails.

    Args:
        obj: the object to check (a dataset, a collate_fn ...).
        root (str): the name of ``obj`` in the returned path.
        max_depth (int): how deep to walk.

    Returns:
        tuple or None: ``(path, description, error)`` such as
        ``('dataset.pipeline.transforms[1].fn', '<lambda> ...',
        "Can't pickle ...")``, or None when ``obj`` pickles.
    """
    error = spawn_pickle_error(obj)
    if error is None:
        return None
    path, culprit, seen = root, obj, {id(obj)}
    for _ in range(max_depth):
        for name, child in _children(culprit):
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_error = spawn_pickle_error(child)
            if child_error is not None:
                path, culprit, error = path + name, child, child_error
                break
        else:
            break
    return path, describe(culprit), f'{type(error).__name__}: {error}'

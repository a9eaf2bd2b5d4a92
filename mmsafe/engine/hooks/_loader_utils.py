"""DataLoader helpers for :class:`DataLoaderProbeHook`.

Everything here works on a plain ``torch.utils.data.DataLoader``: finding
the object that spawn-started workers cannot receive, fetching the first
batches through real worker processes under a deadline (and killing them if
they do not answer), rebuilding a loader with other worker settings, and
estimating how much memory the batches in flight take.
"""
import copyreg
import io
import multiprocessing
import os
import pickle
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

# Start methods that pickle the dataset into each worker.
PICKLING_START_METHODS = ('spawn', 'forkserver')


# --------------------------------------------------------------- pickling --
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
    except RecursionError as e:
        return e
    except Exception as e:  # noqa: BLE001  (pickle raises many types)
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
        except Exception:  # noqa: BLE001
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


# ----------------------------------------------------------- processes --
def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (psutil, /proc, kill 0)."""
    try:
        import psutil
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    except ImportError:
        pass
    if os.name == 'nt':
        # os.kill(pid, 0) would terminate the process on Windows; callers
        # rely on Process.is_alive there.
        return False
    stat = f'/proc/{pid}/stat'
    if os.path.exists('/proc'):
        try:
            with open(stat) as f:
                return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def kill_processes(procs: List[multiprocessing.process.BaseProcess],
                   grace: float = 1.0) -> List[int]:
    """Terminate, then kill, the given processes; return pids still alive."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive() and hasattr(p, 'kill'):
            p.kill()  # a worker that ignores SIGTERM
    for p in procs:
        p.join(timeout=grace)
    return [p.pid for p in procs if p.pid is not None and (
        p.is_alive() or pid_alive(p.pid))]


def shutdown_iterator(it: Any, force: bool = False) -> List[int]:
    """Shut a DataLoader iterator's workers down; return pids left alive.

    With ``force`` the workers are killed first: a worker that blocks
    forever never answers the polite shutdown. Their pids are unregistered
    from torch's SIGCHLD handler beforehand, otherwise killing them raises
    "DataLoader worker ... is killed by signal" in this process.
    """
    if not isinstance(it, _MultiProcessingDataLoaderIter):
        return []
    workers = list(getattr(it, '_workers', []))
    if force:
        from torch.utils.data import _utils
        if getattr(it, '_worker_pids_set', False):
            _utils.signal_handling._remove_worker_pids(id(it))
            it._worker_pids_set = False
        kill_processes(workers, grace=0.2)
    it._shutdown_workers()
    return kill_processes(workers)


def shutdown_loader(loader: DataLoader) -> List[int]:
    """Shut down the persistent iterator a loader may keep."""
    it = getattr(loader, '_iterator', None)
    if it is None:
        return []
    loader._iterator = None
    return shutdown_iterator(it)


# ------------------------------------------------------------- loaders --
def start_method(loader: DataLoader) -> str:
    """The start method the loader's workers use."""
    ctx = loader.multiprocessing_context
    if ctx is None:
        return multiprocessing.get_start_method()
    return ctx.get_start_method()


def batch_size_of(loader: DataLoader) -> int:
    if loader.batch_size is not None:
        return int(loader.batch_size)
    return int(getattr(loader.batch_sampler, 'batch_size', 1) or 1)


def rebuild_loader(loader: DataLoader, num_workers: int,
                   prefetch_factor: Optional[int] = None,
                   persistent_workers: bool = False) -> DataLoader:
    """A new DataLoader on the same dataset, sampler, batch sampler,
    collate_fn and worker_init_fn, with other worker settings.

    The sampler objects are shared, not copied, so ``set_epoch`` (seeding
    per epoch) and infinite samplers keep their state.
    """
    kwargs: Dict[str, Any] = dict(
        dataset=loader.dataset,
        num_workers=num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=loader.generator,
        pin_memory_device=loader.pin_memory_device)
    if hasattr(loader, 'in_order'):
        kwargs['in_order'] = loader.in_order
    if num_workers > 0:
        kwargs.update(
            multiprocessing_context=loader.multiprocessing_context,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers)
    auto_batch = (
        loader.batch_size is not None
        and type(loader.batch_sampler) is torch.utils.data.BatchSampler
        and loader.batch_sampler.sampler is loader.sampler)
    if auto_batch:
        # Keeps `loader.sampler` (DistSamplerSeedHook calls its set_epoch).
        kwargs.update(sampler=loader.sampler, batch_size=loader.batch_size,
                      drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs.update(batch_sampler=loader.batch_sampler)
    else:
        kwargs.update(sampler=loader.sampler, batch_size=None)
    return DataLoader(**kwargs)


def probe_fetch(loader: DataLoader, timeout: float,
                num_batches: Optional[int] = None,
                reset_round: Optional[bool] = None) -> Dict[str, Any]:
    """Fetch the first batches through real worker processes, with a
    deadline, then shut the workers down (killing them if they hang).

    The probe loader shares the dataset, collate_fn, worker_init_fn,
    start method, prefetch factor and persistent-workers setting of
    ``loader`` but reads the first ``batch_size x num_workers`` indices in
    order, with its own random generator, so the real loader's sampler and
    the global RNG are left untouched.

    Args:
        loader (DataLoader): the loader to probe (``num_workers > 0``).
        timeout (float): seconds for the whole probe.
        num_batches (int, optional): batches to fetch; one per worker by
            default, so every worker must deliver.
        reset_round (bool, optional): also restart a persistent iterator
            and fetch again, as the second epoch does. Defaults to
            ``loader.persistent_workers``.

    Returns:
        dict: ``ok`` (bool), ``error`` (str or None), ``timed_out``,
        ``seconds``, ``batch`` (the first batch, or None), ``worker_pids``,
        ``alive_after`` (pids still alive after cleanup; must be empty).
    """
    start = time.monotonic()
    deadline = start + timeout
    workers = loader.num_workers
    bs = batch_size_of(loader)
    n = len(loader.dataset)  # type: ignore[arg-type]
    if num_batches is None:
        num_batches = workers
    num_batches = max(1, min(num_batches, -(-n // bs)))
    indices = list(range(min(n, bs * num_batches)))
    if reset_round is None:
        reset_round = bool(loader.persistent_workers)
    probe = DataLoader(
        loader.dataset, batch_size=bs, sampler=indices,
        num_workers=workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=torch.Generator().manual_seed(0),
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device)
    before = set(multiprocessing.active_children())
    result: Dict[str, Any] = dict(ok=False, error=None, timed_out=False,
                                  batch=None, worker_pids=[],
                                  alive_after=[], exception=None)
    it = None
    try:
        rounds = 2 if reset_round else 1
        for _ in range(rounds):
            it = iter(probe)
            result['worker_pids'] = [
                w.pid for w in getattr(it, '_workers', [])]
            for i in range(num_batches):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                it._timeout = remaining  # bounded wait for this batch
                batch = next(it)
                if result['batch'] is None:
                    result['batch'] = batch
            if isinstance(it, _MultiProcessingDataLoaderIter):
                it._timeout = 0
        result['ok'] = True
    except (TimeoutError, StopIteration) as e:
        result['timed_out'] = isinstance(e, TimeoutError)
        result['error'] = (f'no batch within the {timeout:g} s deadline'
                           if result['timed_out'] else 'no batch')
    except RuntimeError as e:
        result['timed_out'] = 'timed out' in str(e)
        result['error'] = (f'no batch within the {timeout:g} s deadline'
                           if result['timed_out'] else
                           f'{type(e).__name__}: {e}')
        result['exception'] = None if result['timed_out'] else e
    except Exception as e:  # noqa: BLE001  (re-raised by the caller)
        result['error'] = f'{type(e).__name__}: {e}'
        result['exception'] = e
    finally:
        alive: List[int] = []
        if it is not None:
            alive += shutdown_iterator(it, force=not result['ok'])
        probe._iterator = None
        # Workers of an iterator that failed half-way through its own
        # construction are not reachable through `it`.
        stray = [p for p in multiprocessing.active_children()
                 if p not in before]
        alive += kill_processes(stray)
        alive += [pid for pid in result['worker_pids']
                  if pid is not None and pid_alive(pid)]
        result['alive_after'] = sorted(set(alive))
        result['seconds'] = time.monotonic() - start
    return result


def fetch_in_process(loader: DataLoader, batches: int = 1) -> Any:
    """Load the probe's first batch without workers (raises what it
    raises: a dataset bug must surface, not be hidden by a fallback)."""
    bs = batch_size_of(loader)
    n = len(loader.dataset)  # type: ignore[arg-type]
    plain = DataLoader(loader.dataset, batch_size=bs,
                       sampler=list(range(min(n, bs * batches))),
                       num_workers=0, collate_fn=loader.collate_fn)
    return next(iter(plain))


def is_iterable_dataset(loader: DataLoader) -> bool:
    return isinstance(loader.dataset, IterableDataset)


def nbytes(obj: Any, _depth: int = 0) -> int:
    """Bytes of the tensors and arrays in a (collated) batch."""
    if _depth > 8:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    np = sys.modules.get('numpy')
    if np is not None and isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, dict):
        return sum(nbytes(v, _depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v, _depth + 1) for v in obj)
    if hasattr(obj, '__dict__') and not callable(obj):
        return sum(nbytes(v, _depth + 1) for v in vars(obj).values())
    return 0


def available_memory() -> Optional[int]:
    """Available RAM in bytes (psutil, else /proc/meminfo), or None."""
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# ------------------------------------------------------- MMEngine loops --
def replace_loop_loader(loop: Any, new_loader: DataLoader) -> List[int]:
    """Point a train/val/test loop at ``new_loader``; stop the old
    loader's workers. Returns worker pids that could not be stopped."""
    old = loop.dataloader
    alive = shutdown_loader(old)
    loop.dataloader = new_loader
    inf = getattr(loop, 'dataloader_iterator', None)
    if inf is not None:  # IterBasedTrainLoop
        alive += shutdown_iterator(getattr(inf, '_iterator', None))
        loop.dataloader_iterator = type(inf)(new_loader)
    return alive


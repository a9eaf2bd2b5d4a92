"""Decide whether a DataLoader's workers can deliver its batches.

:func:`diagnose_loader` combines the spawn-pickling check, the probe
through real workers and, when a worker failed, the same batch loaded
without workers. Its verdict is one of:

* ``'pass'``: the workers delivered the first batches in time;
* ``'fail'``: they cannot (an object spawn cannot pickle, a worker that
  raised while the main process loads the same batch, a missed deadline);
* ``'not_probed'``: the loader cannot be probed (an ``IterableDataset``,
  or the probe itself failed).

Invariant: an error that the dataset raises without workers as well is a
bug in the data and is raised, never turned into a ``'fail'`` verdict.
"""
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from torch.utils.data import DataLoader

from .inflight_memory import nbytes
from .pickling import PICKLING_START_METHODS, find_unpicklable
from .probe import probe_fetch
from .rebuild import fetch_in_process, is_iterable_dataset, start_method


@dataclass
class Diagnosis:
    """What :func:`diagnose_loader` found about one loader.

    Attributes:
        verdict (str): ``'pass'``, ``'fail'`` or ``'not_probed'``.
        cause (str): why it failed or was not probed (empty on a pass).
        seconds (float): time the probe took.
        batch_bytes (int): bytes of the first batch (on a pass).
        leaked (list[int]): worker pids that outlived the probe.
    """

    verdict: str
    cause: str = ''
    seconds: float = 0.0
    batch_bytes: int = 0
    leaked: List[int] = field(default_factory=list)


def diagnose_loader(loader: DataLoader, timeout: float,
                    on_warning: Optional[Callable[[str], None]] = None,
                    on_leak: Optional[Callable[[List[int]], None]] = None
                    ) -> Diagnosis:
    """Probe ``loader`` (``num_workers > 0``) and judge its workers.

    Args:
        loader (DataLoader): the loader to judge; it is not modified.
        timeout (float): seconds its workers get for the first batches.
        on_warning (callable, optional): called with a message when an
            object would fail under spawn but this start method does not
            pickle it (the loader still works here).
        on_leak (callable, optional): called with the pids of workers that
            outlived the probe, as soon as they are known.

    Returns:
        Diagnosis: the verdict.
    """
    method = start_method(loader)
    start = time.monotonic()
    if is_iterable_dataset(loader):
        return Diagnosis('not_probed', 'an IterableDataset cannot be probed')
    for part, obj in (('dataset', loader.dataset),
                      ('collate_fn', loader.collate_fn),
                      ('worker_init_fn', loader.worker_init_fn)):
        found = find_unpicklable(obj, part)
        if found is None:
            continue
        path, what, error = found
        if method in PICKLING_START_METHODS:
            return Diagnosis(
                'fail', f'{path} cannot be pickled for {method}-started '
                f'workers: {what} ({error}). Replace it with a module-level '
                'function or class', time.monotonic() - start)
        if on_warning is not None:
            on_warning(f'works here with {method!r} workers, but {path} '
                       f'({what}) cannot be pickled, so it would fail under '
                       f'spawn (Windows, macOS) or forkserver: {error}')
        break
    try:
        result = probe_fetch(loader, timeout)
    except Exception as e:  # noqa: BLE001  reported as the verdict's cause
        return Diagnosis('not_probed', 'the probe could not run: '
                         f'{type(e).__name__}: {e}')
    leaked = list(result['alive_after'])
    if leaked and on_leak is not None:
        on_leak(leaked)
    if result['ok']:
        return Diagnosis('pass', seconds=result['seconds'],
                         batch_bytes=nbytes(result['batch']), leaked=leaked)
    cause = result['error']
    if result['exception'] is not None:
        fetch_in_process(loader)  # raises a data bug
        cause = (f'its workers failed ({cause}) while the same batch loads '
                 'without workers')
    elif result['timed_out']:
        cause = ('its workers did not deliver the first batches within the '
                 f'probe deadline of {timeout:g} s; they were killed')
    return Diagnosis('fail', cause, result['seconds'], leaked=leaked)

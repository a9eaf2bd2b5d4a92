"""Stop DataLoader worker processes, politely first, and say which survive.

Invariant: every function returns the pids that are still alive (not
zombies) after it ran; an empty list means no worker outlives the call.
"""
import multiprocessing
import os
import time
from typing import Any, List

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (psutil, /proc, kill 0)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    if os.name == 'nt':
        # os.kill(pid, 0) would terminate the process on Windows; callers
        # rely on Process.is_alive there.
        return False
    if os.path.exists('/proc'):
        try:
            with open(f'/proc/{pid}/stat') as f:
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


def shutdown_loader(loader: DataLoader, force: bool = False) -> List[int]:
    """Shut down the persistent iterator a loader may keep; the loader
    starts fresh workers on its next ``iter``. ``force``: as for
    :func:`shutdown_iterator`."""
    it = getattr(loader, '_iterator', None)
    if it is None:
        return []
    loader._iterator = None
    return shutdown_iterator(it, force=force)


class IgnoreStopSignals:
    """``worker_init_fn`` wrapper: a DataLoader worker outlives the stop
    signals that reach every process of a job (a cluster's SIGTERM or
    SIGUSR1, a console's Ctrl+C or Ctrl+Break); the training process decides
    how the run stops, and then stops its workers.

    A SIGTERM that the training process itself sends (``terminate()`` of
    multiprocessing or of torch's shutdown) still ends the worker, and so
    does one that arrives after the training process is gone: a thread of
    the worker waits for SIGTERM with ``sigwaitinfo`` and reads its sender.
    Where that is not available (Windows, macOS) SIGTERM keeps its default.

    Args:
        inner (callable, optional): the loader's own ``worker_init_fn``,
            called afterwards.
    """

    IGNORED = ('SIGINT', 'SIGUSR1', 'SIGBREAK')

    def __init__(self, inner=None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        import signal
        for name in self.IGNORED:
            sig = getattr(signal, name, None)
            if sig is not None:
                signal.signal(sig, signal.SIG_IGN)
        _end_only_on_parents_sigterm()
        if self.inner is not None:
            self.inner(worker_id)


def _end_only_on_parents_sigterm() -> None:
    import signal
    import threading
    if not (hasattr(signal, 'sigwaitinfo')
            and hasattr(signal, 'pthread_sigmask')):
        return
    parent = os.getppid()
    # A handler inherited from the training process (fork) would make the
    # worker ignore its parent's terminate().
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == parent or os.getppid() != parent:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                os.kill(os.getpid(), signal.SIGTERM)
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait, name='mmsafe-worker-sigterm',
                     daemon=True).start()

"""Helpers shared by the tests: run tools/train.py for real, with a hard
timeout that kills the whole process group, so a hang fails the test.

Every process group started here is registered until it is killed:
``run_command`` kills its group when the command ends, times out or is
interrupted (pytest-timeout's exception included), and tests/conftest.py
kills whatever is still registered after each test. A command's timeout is
also cut to the time left before the test's own pytest-timeout, so chained
runs fail with their output instead of adding up past it.
"""
import contextlib
import fcntl
import os
import os.path as osp
import pickle
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Set, Tuple)

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TRAIN = osp.join(REPO_ROOT, 'tools', 'train.py')


class RunResult:

    def __init__(self, returncode: int, output: str, timed_out: bool):
        self.returncode = returncode
        self.output = output
        self.timed_out = timed_out

    def __repr__(self):
        return (f'RunResult(rc={self.returncode}, timed_out={self.timed_out},'
                f'\n{self.output[-6000:]})')


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# Process groups started by the tests and not killed yet.
LIVE_GROUPS: Set[int] = set()
# time.monotonic() by which the running test must end (set by conftest).
_test_deadline: Optional[float] = None
# What to do when a test starts a process under ``make test-fast``.
_fast_mode_message: Optional[str] = None
# Seconds kept between a command's forced end and the test's own timeout.
TIMEOUT_MARGIN = 30


def set_test_deadline(deadline: Optional[float]) -> None:
    global _test_deadline
    _test_deadline = deadline


def set_fast_mode(message: Optional[str]) -> None:
    global _fast_mode_message
    _fast_mode_message = message


def time_left_in_test(timeout: float) -> float:
    """``timeout``, cut to what the running test has left (at least 1 s)."""
    if _test_deadline is None:
        return timeout
    return max(1.0, min(timeout, _test_deadline - time.monotonic()))


def spawn(cmd: Sequence[str], **popen_args) -> subprocess.Popen:
    """``subprocess.Popen`` in a new process group, registered for
    ``kill_group``/``kill_live_groups``."""
    if _fast_mode_message is not None:
        import pytest
        pytest.fail(_fast_mode_message + f' (command: {list(cmd)[:4]})',
                    pytrace=False)
    proc = subprocess.Popen(list(cmd), start_new_session=True, **popen_args)
    LIVE_GROUPS.add(proc.pid)
    return proc


def kill_group(pgid: int) -> None:
    """SIGKILL a process group (a no-op when it is gone)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    LIVE_GROUPS.discard(pgid)


def kill_live_groups() -> List[int]:
    """Kill every registered process group; returns those that were
    registered."""
    groups = sorted(LIVE_GROUPS)
    for pgid in groups:
        kill_group(pgid)
    return groups


def child_env(env: Optional[dict] = None) -> dict:
    """This process's environment for a tool run by a test: one thread
    per op, the repository importable, unbuffered output, then ``env``."""
    full_env = dict(os.environ)
    full_env.setdefault('OMP_NUM_THREADS', '1')
    full_env['PYTHONPATH'] = REPO_ROOT + os.pathsep + full_env.get(
        'PYTHONPATH', '')
    full_env['PYTHONUNBUFFERED'] = '1'
    if env:
        full_env.update(env)
    return full_env


def run_command(cmd: Sequence[str], timeout: float,
                env: Optional[dict] = None,
                cwd: str = REPO_ROOT) -> RunResult:
    """Run ``cmd`` in its own process group, which is killed when the
    command ends (leftover children included), on timeout, and when the
    test is interrupted. ``timeout`` is cut to the test's time left."""
    full_env = child_env(env)
    limit = time_left_in_test(timeout)
    proc = spawn(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=limit)
        return RunResult(proc.returncode, out, False)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, _ = proc.communicate()
        note = '' if limit >= timeout else (
            f'\n[tests] stopped after {limit:.0f} s: the test\'s own timeout '
            'was near (its chained runs need less time or a larger '
            '@pytest.mark.timeout)')
        return RunResult(-9, (out or '') + note, True)
    finally:
        kill_group(proc.pid)
        if proc.poll() is None:
            proc.wait()


def run_train(config: str, nproc: int = 1, timeout: float = 300,
              args: Sequence[str] = (), env: Optional[dict] = None
              ) -> RunResult:
    """Run ``tools/train.py`` on ``config``; with ``nproc > 1`` through
    ``torch.distributed.run`` with ``--launcher pytorch`` (gloo on CPU)."""
    if nproc > 1:
        cmd: List[str] = [
            sys.executable, '-m', 'torch.distributed.run',
            f'--nproc_per_node={nproc}', '--master_addr=127.0.0.1',
            f'--master_port={free_port()}', TRAIN, config,
            '--launcher', 'pytorch', *args]
    else:
        cmd = [sys.executable, TRAIN, config, *args]
    return run_command(cmd, timeout=timeout, env=env)


def run_ranks_without_agent(config: str, nproc: int, timeout: float,
                            args: Sequence[str] = ()) -> List[RunResult]:
    """Start ``nproc`` ranks of ``tools/train.py --launcher pytorch`` as
    ``srun`` does, without torchrun's agent: each process gets ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` and rank
    0 serves the rendezvous store. Each rank's result carries its own
    output; a rank still running at the common deadline is killed
    (``timed_out``)."""
    port = free_port()
    procs, files = [], []
    start = time.monotonic()
    limit = time_left_in_test(timeout)
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_RANK=str(rank), MASTER_ADDR='127.0.0.1',
                   MASTER_PORT=str(port), PYTHONUNBUFFERED='1')
        env.setdefault('OMP_NUM_THREADS', '1')
        env['PYTHONPATH'] = REPO_ROOT + os.pathsep + env.get('PYTHONPATH',
                                                             '')
        out = tempfile.TemporaryFile(mode='w+')
        files.append(out)
        procs.append(spawn([sys.executable, TRAIN, config, '--launcher',
                            'pytorch', *args], cwd=REPO_ROOT, env=env,
                           stdout=out, stderr=subprocess.STDOUT, text=True))
    results = []
    try:
        for proc, out in zip(procs, files):
            left = max(0.1, limit - (time.monotonic() - start))
            try:
                proc.wait(timeout=left)
                timed_out = False
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                proc.wait()
                timed_out = True
            out.seek(0)
            results.append(RunResult(proc.returncode, out.read(), timed_out))
    finally:
        for proc, out in zip(procs, files):
            kill_group(proc.pid)
            out.close()
    return results


def write_config(path: str, text: str) -> str:
    """Write a config file from an indented string; returns its path."""
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(textwrap.dedent(text))
    return path


_SHARED: Dict[str, Any] = {}


def run_once_per_session(name: str, run: Callable[[str], Any]) -> Any:
    """``run(folder)`` once per test session, shared by every test that
    asks for ``name``, in this process or in another pytest-xdist worker.

    The first caller runs it in a new folder under the session's temporary
    folder (tests/conftest.py removes that folder at the end of the session,
    after every worker) while it holds ``<name>.lock``; its result is then
    pickled next to the lock, written atomically. A caller that finds the
    lock held waits for it, then loads that result. A run that raised leaves
    no result: the next caller runs it again.

    Args:
        name: what identifies the run (a file name).
        run: makes the run in the folder it is given and returns what the
            tests read (picklable, e.g. a ``(work_dir, RunResult)`` tuple).

    Returns:
        Whatever ``run`` returned, for every caller.
    """
    if name in _SHARED:
        return _SHARED[name]
    base = osp.join(tempfile.gettempdir(), 'mmsafe-shared-runs')
    os.makedirs(base, exist_ok=True)
    done = osp.join(base, f'{name}.pkl')
    with open(osp.join(base, f'{name}.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not osp.isfile(done):
                result = run(tempfile.mkdtemp(prefix=f'{name}-', dir=base))
                partial = f'{done}.{os.getpid()}'
                with open(partial, 'wb') as f:
                    pickle.dump(result, f)
                os.replace(partial, done)
            with open(done, 'rb') as f:
                _SHARED[name] = pickle.load(f)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return _SHARED[name]


def cpu_and_cuda() -> list:
    """``pytest.mark.parametrize`` values for a test that runs on CPU and,
    where a GPU is present, on CUDA (skipped without one)."""
    import pytest
    import torch
    return ['cpu', pytest.param('cuda', marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason='needs CUDA'))]


def load_module_from_path(name: str, path: str):
    """Import the script at ``path`` (e.g. a file of tools/, which is not a
    package) as module ``name``."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def skip_without_autocast(device: str, dtype: str) -> None:
    """Skip the calling test where this torch's autocast on ``device`` has
    no ``dtype`` (CPU float16 before torch 2.4 or so: bfloat16 only, and
    ``AmpNaNSkipOptimWrapper`` refuses float16 there, tested by
    test_amp_matrix.py::test_cpu_float16_refused_where_torch_lacks_it)."""
    import pytest
    import torch

    from mmsafe.compat import cpu_autocast_dtypes
    if device == 'cpu' and getattr(torch, dtype) not in cpu_autocast_dtypes():
        pytest.skip(f'torch {torch.__version__} has no CPU autocast in '
                    f'{dtype}')


@contextlib.contextmanager
def logged_messages() -> Iterator[List[str]]:
    """The messages MMEngine's current logger emits inside the block (the
    list fills as they come; the handler is removed on exit)."""
    import logging

    from mmengine.logging import MMLogger
    messages: List[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def run_and_signal(cmd: Sequence[str], timeout: float,
                   actions: Sequence[Tuple[Callable[[], bool], Callable[
                       [subprocess.Popen], None]]],
                   env: Optional[dict] = None,
                   cwd: str = REPO_ROOT) -> RunResult:
    """Run ``cmd`` like :func:`run_command`; meanwhile, for each
    ``(ready, act)`` in order, wait until ``ready()`` is true, then call
    ``act(proc)`` (e.g. send a signal to the launcher). The output is read
    by a thread, so a chatty process never blocks on its pipe."""
    import threading
    full_env = child_env(env)
    limit = time_left_in_test(timeout)
    deadline = time.monotonic() + limit
    proc = spawn(cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True)
    chunks: List[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(proc.stdout),
                              daemon=True)
    reader.start()
    timed_out = False
    try:
        for ready, act in actions:
            while not ready() and proc.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            act(proc)
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        kill_group(proc.pid)
        if proc.poll() is None:
            proc.wait()
        reader.join(timeout=10)
    return RunResult(-9 if timed_out else proc.returncode, ''.join(chunks),
                     timed_out)

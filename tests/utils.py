"""Helpers shared by the tests: run tools/train.py for real, with a hard
timeout that kills the whole process group, so a hang fails the test."""
import os
import os.path as osp
import signal
import subprocess
import sys
import textwrap
from typing import List, Optional, Sequence

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


def run_command(cmd: Sequence[str], timeout: float,
                env: Optional[dict] = None,
                cwd: str = REPO_ROOT) -> RunResult:
    """Run ``cmd`` in its own process group; kill the group on timeout."""
    full_env = dict(os.environ)
    full_env.setdefault('OMP_NUM_THREADS', '1')
    full_env['PYTHONPATH'] = REPO_ROOT + os.pathsep + full_env.get(
        'PYTHONPATH', '')
    full_env['PYTHONUNBUFFERED'] = '1'
    if env:
        full_env.update(env)
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, env=full_env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return RunResult(proc.returncode, out, False)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return RunResult(-9, out or '', True)


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


def write_config(path: str, text: str) -> str:
    """Write a config file from an indented string; returns its path."""
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(textwrap.dedent(text))
    return path

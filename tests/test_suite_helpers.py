"""tests.utils.run_once_per_session: a run shared by several test files is
made once per session, also when pytest-xdist workers (separate processes)
ask for it at the same time."""
import glob
import os
import os.path as osp
import subprocess
import sys
import tempfile

import pytest

from tests.utils import REPO_ROOT, kill_group, run_once_per_session, spawn

# Each process asks for the same run; the run records who made it and takes
# long enough that the other process asks while it is under way.
ASKER = """
import os, sys, time
from tests.utils import run_once_per_session

def run(folder):
    open(os.path.join(os.environ['RUN_LOG'], f'made-by-{os.getpid()}'),
         'w').close()
    time.sleep(1.0)
    return folder, os.getpid()

print('result:', run_once_per_session('toy', run))
"""


def test_processes_asking_together_share_one_run(tmp_path):
    session, log = tmp_path / 'session', tmp_path / 'log'
    session.mkdir()
    log.mkdir()
    env = dict(os.environ, TMPDIR=str(session), RUN_LOG=str(log),
               PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get(
                   'PYTHONPATH', ''))
    procs = [spawn([sys.executable, '-c', ASKER], cwd=REPO_ROOT, env=env,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   text=True) for _ in range(3)]
    try:
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            kill_group(proc.pid)
    assert [proc.returncode for proc in procs] == [0, 0, 0], outputs
    made = os.listdir(log)
    assert len(made) == 1, (made, outputs)
    results = {line for out in outputs for line in out.splitlines()
               if line.startswith('result:')}
    assert len(results) == 1, outputs
    maker = int(made[0].rsplit('-', 1)[1])
    assert f', {maker})' in results.pop()
    shared = glob.glob(str(session / 'mmsafe-shared-runs' / 'toy-*'))
    assert len(shared) == 1 and osp.isdir(shared[0]), shared


def test_a_run_that_raised_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    folders = []

    def broken(folder):
        folders.append(folder)
        raise RuntimeError('toy failure')

    def healthy(folder):
        folders.append(folder)
        return 'made'

    with pytest.raises(RuntimeError, match='toy failure'):
        run_once_per_session('toy_retry', broken)
    assert run_once_per_session('toy_retry', healthy) == 'made'
    # Made once: later callers get the stored result.
    assert run_once_per_session('toy_retry', broken) == 'made'
    assert len(folders) == 2 and folders[0] != folders[1], folders

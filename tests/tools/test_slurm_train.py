"""``tools/slurm_train.sh`` on a machine without Slurm: stand-ins for
``srun`` (starts the tasks with Slurm's variables, like ``--launcher
slurm`` expects) and ``scontrol`` (host names; records ``requeue``) play
the cluster. Slurm's ``--signal`` is played by sending SIGUSR1 to every
process of the job step, DataLoader workers included; then the requeued
job (the script run again) must continue to the weights of the run that
was never interrupted."""
import os
import os.path as osp
import signal
import stat
import sys

import psutil
import pytest

from mmsafe.events import read_events
from tests.engine.test_preemption import (MODES, _assert_same_weights,
                                          _config, _dumps, _progress,
                                          uninterrupted)
from tests.utils import REPO_ROOT, free_port, run_and_signal

pytestmark = pytest.mark.slow

SLURM_TRAIN = osp.join(REPO_ROOT, 'tools', 'slurm_train.sh')
MODE = 'ddp_epoch_workers'  # 2 tasks, 2 loader workers each
TIMEOUT = 300

SRUN = f"""#!{sys.executable}
import os, subprocess, sys
args, opts = sys.argv[1:], []
while args and args[0].startswith('-'):
    opts += args[:2] if args[0] == '-p' else args[:1]
    args = args[2:] if args[0] == '-p' else args[1:]
with open(os.environ['STUB_LOG'], 'a') as f:
    f.write('srun ' + ' '.join(opts) + '\\n')
ntasks = int([o for o in opts if o.startswith('--ntasks=')][0][9:])
procs = [subprocess.Popen(args, env=dict(
    os.environ, SLURM_PROCID=str(r), SLURM_NTASKS=str(ntasks),
    SLURM_LOCALID=str(r), SLURM_NODELIST='node1')) for r in range(ntasks)]
codes = [p.wait() for p in procs]
sys.exit(max(codes) if min(codes) >= 0 else 1)
"""

SCONTROL = """#!/usr/bin/env bash
echo "scontrol $*" >> "$STUB_LOG"
if [ "$1" = show ] && [ "$2" = hostname ]; then echo 127.0.0.1; fi
"""


def _stub(folder, name, text):
    path = osp.join(folder, name)
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


def _signal_the_step(proc):
    """What Slurm's --signal does: the signal to every process of the job
    step (the tasks and their loader workers), not to the batch script."""
    srun = [p for p in psutil.Process(proc.pid).children(recursive=True)
            if 'srun' in ' '.join(p.cmdline())]
    for task in srun[0].children(recursive=True):
        try:
            task.send_signal(signal.SIGUSR1)
        except psutil.NoSuchProcess:
            pass


@pytest.mark.timeout(900)
def test_slurm_signal_saves_requeues_and_the_requeued_job_resumes_exactly(
        tmp_path):
    nproc, workers, _, iterations, _ = MODES[MODE]
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    _stub(str(bin_dir), 'srun', SRUN)
    _stub(str(bin_dir), 'scontrol', SCONTROL)
    stub_log = str(tmp_path / 'stub.log')
    cfg, work_dir = _config(tmp_path, 'run', MODE, delay=0.25)
    env = dict(STUB_LOG=stub_log, SLURM_JOB_ID='4242', GPUS=str(nproc),
               CPUS_PER_TASK='1', MASTER_PORT=str(free_port()),
               PATH=os.pathsep.join([str(bin_dir), osp.dirname(sys.executable),
                                     os.environ.get('PATH', '')]))
    cmd = ['bash', SLURM_TRAIN, 'cpu', 'llvip', cfg, work_dir]

    first = run_and_signal(cmd, TIMEOUT,
                           [(_progress(work_dir, 3), _signal_the_step)],
                           env=env)
    assert first.returncode == 0, first
    assert 'job 4242 requeued' in first.output, first
    with open(stub_log) as f:
        calls = f.read().splitlines()
    assert any(c.startswith('srun ') and '--signal=USR1@120' in c
               and f'--ntasks={nproc}' in c for c in calls), calls
    assert 'scontrol requeue 4242' in calls, calls
    events = read_events(work_dir, 'preempted')
    assert len(events) == 1 and events[0]['signals'] == ['SIGUSR1'], events
    assert events[0]['ranks_signalled'] == list(range(nproc)), events
    done = events[0]['iter']
    path = osp.join(work_dir, f'preempted_iter_{done}.pth')

    env['MASTER_PORT'] = str(free_port())
    second = run_and_signal(cmd, TIMEOUT, [], env=env)
    assert second.returncode == 0, second
    assert f'resumed from {path} at ' in second.output, second
    assert ': exact: the same remaining samples' in second.output, second
    got = _dumps(work_dir, nproc)
    assert got[0]['last_iter'] == iterations
    _assert_same_weights(got, uninterrupted(MODE), nproc, 'slurm requeue')

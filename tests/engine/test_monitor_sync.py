"""MonitorSync: monitoring values travel at the log interval, in one
fixed-size all-reduce, and every rank reads the same sums."""
import sys
import textwrap
from types import SimpleNamespace

import pytest

from mmsafe.engine.monitor_sync import (MAX_NAMES, MonitorSync,
                                        monitor_sync_of)
from mmsafe.engine.run_context import RunContext
from tests.utils import REPO_ROOT, free_port, run_command


@pytest.fixture
def sync():
    return MonitorSync()


def runner_at(it, max_iters=100):
    return SimpleNamespace(iter=it, max_iters=max_iters, hooks=[])


def test_owner_is_the_runner_or_the_calling_hook(sync):
    owned = SimpleNamespace(mmsafe_context=RunContext(monitor_sync=sync))
    assert monitor_sync_of(owned) is sync
    # A runner without one: every caller gets its own instance.
    plain = SimpleNamespace()
    first, second = monitor_sync_of(plain), monitor_sync_of(plain)
    assert isinstance(first, MonitorSync) and first is not second
    assert not hasattr(plain, 'monitor_sync')


def test_posts_add_up_and_single_process_syncs_every_iteration(sync):
    sync.declare('flag')
    sync.declare('value')
    sync.post('flag', 0.0)
    sync.post('flag', 1.0)
    sync.post('value', 2.5)
    assert sync.pending('flag') == 1.0
    assert sync.sync(runner_at(0)) is True
    assert sync.last('flag') == 1.0 and sync.last('value') == 2.5
    assert sync.last_count('flag') == 2
    # A second hook in the same iteration publishes its own post at once.
    sync.post('value', 4.0)
    assert sync.sync(runner_at(0)) is True
    assert sync.last('value') == 4.0 and sync.pending('value') == 0.0
    # Nothing posted: the sync still happens (no early return), all zero.
    assert sync.sync(runner_at(1)) is True
    assert sync.last('flag') == 0.0 and sync.last('value') == 0.0
    assert sync.num_syncs == 3 and sync.num_collectives == 0


def test_undeclared_name_and_capacity(sync):
    with pytest.raises(KeyError, match='declare'):
        sync.post('never_declared', 1.0)
    for i in range(MAX_NAMES):
        sync.declare(f'n{i:03d}')
    with pytest.raises(RuntimeError, match='at most'):
        sync.declare('one_too_many')


DIST_SCRIPT = '''
import os
import sys
from types import SimpleNamespace
import torch.distributed as dist
dist.init_process_group('gloo')
sys.path.insert(0, sys.argv[1])
from mmsafe.engine.monitor_sync import MonitorSync
rank = dist.get_rank()
calls = []
original = dist.all_reduce


def counted(*args, **kwargs):
    calls.append(1)
    return original(*args, **kwargs)


dist.all_reduce = counted


def say(*args):
    # One write per line: the ranks share one pipe.
    os.write(1, (' '.join(map(str, args)) + '\\n').encode())


s = MonitorSync(interval=5)
s.declare('empty_batch')
s.declare('loss_sum')
synced = []
for it in range(12):
    s.post('empty_batch', float(rank == 1 and it in (2, 7)))
    s.post('loss_sum', 1.5 + rank)
    runner = SimpleNamespace(iter=it, max_iters=12, hooks=[])
    if s.sync(runner):
        synced.append(it)
        say(f'RANK{rank} it{it}', s.last('empty_batch'), s.last('loss_sum'),
            s.last_count('loss_sum'))
    s.sync(runner)  # a second hook in the same iteration: no collective
say(f'RANK{rank} synced {synced} collectives {len(calls)}')
# A name known on one rank only must raise on both ranks, not hang.
if rank == 0:
    s.declare('only_on_rank0')
try:
    s.reduce()
    say(f'RANK{rank} no error')
except RuntimeError as e:
    say(f'RANK{rank} mismatch raised: {str(e)[:60]}')
# barrier, then destroy, as tools/train.py ends: no gloo abort at exit
from mmsafe.tools_lib.cli import release_process_group
release_process_group()
'''


def test_two_ranks_sync_at_the_interval_and_mismatch_raises_everywhere(
        tmp_path):
    script = tmp_path / 'sync_dist.py'
    script.write_text(textwrap.dedent(DIST_SCRIPT))
    result = run_command(
        [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
         '--master_addr=127.0.0.1', f'--master_port={free_port()}',
         str(script), REPO_ROOT],
        timeout=180)
    assert not result.timed_out, result
    assert result.returncode == 0, result
    for rank in (0, 1):
        # Iterations 4 and 9 (every 5) and 11 (the last): 3 collectives.
        assert (f'RANK{rank} synced [4, 9, 11] collectives 3'
                in result.output), result
        assert f'RANK{rank} it4 1.0 20.0 10' in result.output, result
        assert f'RANK{rank} it9 1.0 20.0 10' in result.output, result
        assert f'RANK{rank} it11 0.0 8.0 4' in result.output, result
        assert f'RANK{rank} mismatch raised' in result.output, result

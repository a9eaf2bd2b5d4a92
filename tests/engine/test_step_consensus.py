"""StepConsensus: one fixed-size all-reduce carries every guard's values."""
import os.path as osp
import sys
import textwrap

import pytest
from mmengine.logging import MessageHub

from mmsafe.dist import MAX_NAMES, StepConsensus
from tests.utils import REPO_ROOT, free_port, run_command


@pytest.fixture
def consensus():
    StepConsensus.reset()
    yield StepConsensus.get()
    StepConsensus.reset()


def test_get_is_process_wide(consensus):
    assert StepConsensus.get() is consensus


def test_posts_add_up_and_reduce_clears(consensus):
    consensus.declare('flag', skip_when='any')
    consensus.post('flag', 0.0)
    consensus.post('flag', 1.0)
    consensus.post('value', 2.5)
    assert consensus.pending('flag') == 1.0
    reduced = consensus.reduce()
    assert reduced == {'flag': 1.0, 'value': 2.5}
    assert consensus.last_count('flag') == 2
    assert consensus.last_skip_reasons() == ['flag']
    # Nothing posted: the reduce still happens (no early return), all zero.
    assert consensus.reduce() == {'flag': 0.0, 'value': 0.0}
    assert consensus.last_skip_reasons() == []
    assert consensus.num_reduces == 2


def test_all_rule_needs_every_post_set(consensus):
    consensus.declare('empty', skip_when='all')
    consensus.post('empty', 1.0)
    consensus.post('empty', 0.0)
    consensus.reduce()
    assert consensus.last_skip_reasons() == []
    consensus.post('empty', 1.0)
    consensus.post('empty', 1.0)
    consensus.reduce()
    assert consensus.last_skip_reasons() == ['empty']
    consensus.reduce()  # no post at all: 'all' must not fire
    assert consensus.last_skip_reasons() == []


def test_bad_rule_and_capacity(consensus):
    with pytest.raises(ValueError, match='skip_when'):
        consensus.declare('x', skip_when='most')
    for i in range(MAX_NAMES):
        consensus.declare(f'n{i:03d}')
    with pytest.raises(RuntimeError, match='at most'):
        consensus.declare('one_too_many')


def test_reduce_pending_once_per_iteration_and_not_when_managed(consensus):
    hub = MessageHub.get_current_instance()
    hub.update_info('iter', 7)
    consensus.post('a', 1.0)
    assert consensus.reduce_pending() == {'a': 1.0}
    # A second hook in the same iteration does not reduce again.
    consensus.post('a', 1.0)
    assert consensus.reduce_pending() is None
    hub.update_info('iter', 8)
    assert consensus.reduce_pending() == {'a': 1.0}
    consensus.attach_optim_wrapper('NaNSkipOptimWrapper')
    hub.update_info('iter', 9)
    assert consensus.reduce_pending() is None
    assert consensus.num_reduces == 2


DIST_SCRIPT = '''
import importlib.util
import os
import sys
import torch.distributed as dist
dist.init_process_group('gloo')
# mmsafe/dist.py needs only torch and MMEngine: load it without importing
# MMDetection (the package's registrations) to keep the test short.
spec = importlib.util.spec_from_file_location('mmsafe_dist', sys.argv[1])
mmsafe_dist = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mmsafe_dist)
StepConsensus = mmsafe_dist.StepConsensus
all_reduce_sum = mmsafe_dist.all_reduce_sum
rank = dist.get_rank()


def say(*args):
    # One write per line: the ranks share one pipe.
    os.write(1, (' '.join(map(str, args)) + '\\n').encode())

c = StepConsensus.get()
c.declare('empty_batch', skip_when='all')
c.declare('nonfinite_loss', skip_when='any')
# rank 1 empty, rank 0 not; NaN loss only on rank 1
c.post('empty_batch', float(rank == 1))
c.post('nonfinite_loss', float(rank == 1))
c.post('loss_sum', 1.5 + rank)
r = c.reduce()
say(f'RANK{rank} sums', r['empty_batch'], r['nonfinite_loss'],
      r['loss_sum'], c.last_skip_reasons())
c.post('empty_batch', 1.0)
c.reduce()
say(f'RANK{rank} all_empty', c.last_skip_reasons())
# A name known on one rank only must raise on both ranks, not hang.
if rank == 0:
    c.declare('only_on_rank0')
try:
    c.reduce()
    say(f'RANK{rank} no error')
except RuntimeError as e:
    say(f'RANK{rank} mismatch raised: {str(e)[:60]}')
dist.destroy_process_group()
'''


def test_two_ranks_agree_and_mismatch_raises_everywhere(tmp_path):
    script = tmp_path / 'consensus_dist.py'
    script.write_text(textwrap.dedent(DIST_SCRIPT))
    result = run_command(
        [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
         '--master_addr=127.0.0.1', f'--master_port={free_port()}',
         str(script), osp.join(REPO_ROOT, 'mmsafe', 'dist.py')],
        timeout=180)
    assert not result.timed_out, result
    assert result.returncode == 0, result
    for rank in (0, 1):
        assert (f"RANK{rank} sums 1.0 1.0 4.0 ['nonfinite_loss']"
                in result.output), result
        assert (f"RANK{rank} all_empty ['empty_batch']"
                in result.output), result
        assert f'RANK{rank} mismatch raised' in result.output, result


"""StepConsensus: one fixed-size all-reduce carries every guard's values."""
import sys
import textwrap

import pytest
from mmengine.logging import MessageHub

from mmsafe.dist import MAX_NAMES, StepConsensus
from tests.utils import free_port, run_command


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
import time
import torch.distributed as dist
dist.init_process_group('gloo')
from mmsafe.dist import StepConsensus, all_reduce_sum
rank = dist.get_rank()
c = StepConsensus.get()
c.declare('empty_batch', skip_when='all')
c.declare('nonfinite_loss', skip_when='any')
# rank 1 empty, rank 0 not; NaN loss only on rank 1
c.post('empty_batch', float(rank == 1))
c.post('nonfinite_loss', float(rank == 1))
c.post('loss_sum', 1.5 + rank)
r = c.reduce()
print(f'RANK{rank} sums', r['empty_batch'], r['nonfinite_loss'],
      r['loss_sum'], c.last_skip_reasons(), flush=True)
c.post('empty_batch', 1.0)
c.reduce()
print(f'RANK{rank} all_empty', c.last_skip_reasons(), flush=True)
# A name known on one rank only must raise on both ranks, not hang.
if rank == 0:
    c.declare('only_on_rank0')
try:
    c.reduce()
    print(f'RANK{rank} no error', flush=True)
except RuntimeError as e:
    print(f'RANK{rank} mismatch raised: {str(e)[:60]}', flush=True)
# Cost of the single consensus vector vs one collective per guard.
for _ in range(5):
    all_reduce_sum([0.0] * 130)
n = 50
t0 = time.perf_counter()
for _ in range(n):
    all_reduce_sum([0.0] * 130)
one = (time.perf_counter() - t0) / n
t0 = time.perf_counter()
for _ in range(n):
    for _ in range(4):
        all_reduce_sum([0.0])
four = (time.perf_counter() - t0) / n
if rank == 0:
    print(f'TIMING one_vector_ms={one * 1e3:.3f} '
          f'four_scalars_ms={four * 1e3:.3f}', flush=True)
dist.destroy_process_group()
'''


def test_two_ranks_agree_and_mismatch_raises_everywhere(tmp_path):
    script = tmp_path / 'consensus_dist.py'
    script.write_text(textwrap.dedent(DIST_SCRIPT))
    result = run_command(
        [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
         '--master_addr=127.0.0.1', f'--master_port={free_port()}',
         str(script)], timeout=180)
    assert not result.timed_out, result
    assert result.returncode == 0, result
    for rank in (0, 1):
        assert (f"RANK{rank} sums 1.0 1.0 4.0 ['nonfinite_loss']"
                in result.output), result
        assert (f"RANK{rank} all_empty ['empty_batch']"
                in result.output), result
        assert f'RANK{rank} mismatch raised' in result.output, result
    timing = [line for line in result.output.splitlines()
              if line.startswith('TIMING')]
    assert timing, result
    print(timing[0])


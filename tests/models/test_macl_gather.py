"""MACLHead's cross-rank negatives under real 2-process gloo, with a hard
timeout: unequal and empty per-rank batches must neither hang nor change
the loss's meaning."""
import os.path as osp
import sys

from tests.utils import free_port, run_command

WORKER = osp.join(osp.dirname(osp.abspath(__file__)), 'macl_gather_worker.py')


def test_gather_negatives_with_unequal_and_empty_ranks():
    result = run_command([
        sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
        '--master_addr=127.0.0.1', f'--master_port={free_port()}', WORKER
    ], timeout=300)
    assert not result.timed_out, result
    assert result.returncode == 0, result
    # rank 0: the [0, 1] round has nothing to contrast; rank 1: neither
    # does it (1 pair in total)
    # 2 ranks x 3 pairs = 1 process x 6 pairs: loss, gradients (through
    # the gathered negatives) and centring statistics, over 3 SGD steps.
    assert 'RANK0 EXACT' in result.output and 'RANK1 EXACT' in \
        result.output, result
    assert 'RANK0 OK small_batches=1' in result.output, result
    assert 'RANK1 OK small_batches=1' in result.output, result

"""Run by test_macl_gather.py under ``torch.distributed.run`` (2 processes,
gloo): MACLHead with ``gather_negatives=True`` when ranks hold different
numbers of pairs (1 and 3, then 0 and 1)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

import mmsafe  # noqa: F401
from mmdet.registry import MODELS


def check(head, sizes, rank, generator):
    total = sum(sizes)
    vis_all = torch.randn(total, 8, 2, 2, generator=generator)
    ir_all = torch.randn(total, 8, 2, 2, generator=generator)
    lo = sum(sizes[:rank])
    hi = lo + sizes[rank]
    head.zero_grad()
    loss = head.loss((vis_all[lo:hi], ), (ir_all[lo:hi], ))['loss_macl']
    assert head.last_num_pairs == total, head.last_num_pairs
    if total >= 2 and sizes[rank] >= 1:
        # Reference: the whole batch in one process; this rank's queries
        # against every rank's candidates.
        with torch.no_grad():
            v, r = head.embed(vis_all, ir_all)
            t = head.temperature
            labels = torch.arange(lo, hi)
            ref = 0.5 * (F.cross_entropy(v[lo:hi] @ r.t() / t, labels) +
                         F.cross_entropy(r[lo:hi] @ v.t() / t, labels))
        torch.testing.assert_close(loss.detach(), head.loss_weight * ref)
    else:
        assert loss.item() == 0.0
    loss.backward()
    missing = [n for n, p in head.named_parameters() if p.grad is None]
    assert not missing, missing
    if total >= 2 and sizes[rank] >= 1:
        assert head.vis_projector[0].weight.grad.abs().sum() > 0


def main():
    dist.init_process_group('gloo')
    rank = dist.get_rank()
    torch.manual_seed(0)  # same head on both ranks, as after DDP's broadcast
    head = MODELS.build(
        dict(type='MACLHead', in_dim=8, proj_dim=4, feature_level=0,
             center_momentum=None, gather_negatives=True, loss_weight=0.5))
    generator = torch.Generator().manual_seed(123)
    check(head, [1, 3], rank, generator)
    # rank 0 has no pair at all: it must still join the all-gathers
    check(head, [0, 1], rank, generator)
    check(head, [2, 2], rank, generator)
    dist.barrier()
    print(f'RANK{rank} OK small_batches={head.num_small_batches}', flush=True)
    dist.destroy_process_group()


if __name__ == '__main__':
    main()

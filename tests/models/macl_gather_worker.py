"""Run by test_macl_gather.py under ``torch.distributed.run`` (2 processes,
gloo): MACLHead with ``gather_negatives=True`` when ranks hold different
numbers of pairs (1 and 3, then 0 and 1); and 2 ranks with B pairs each
against one process with 2B pairs, over a few SGD steps."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

import mmsafe  # noqa: F401
from mmsafe.registry import MODELS
from mmsafe.tools_lib.cli import release_process_group


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


EXACT_CFG = dict(type='MACLHead', in_dim=8, proj_dim=4, feature_level=0,
                 center_momentum=0.5, gather_negatives=True, loss_weight=0.5)
STEPS, PAIRS = 3, 3  # pairs per rank


def exact_run(rank=None, world=1):
    """Loss, gradients and centres per SGD step: one process with the whole
    batch (rank None), or this rank's half with DDP's gradient average."""
    torch.manual_seed(0)
    head = MODELS.build(EXACT_CFG)
    head.train()
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(7)
    records = []
    for _ in range(STEPS):
        vis = torch.randn(PAIRS * 2, 8, 2, 2, generator=generator)
        ir = vis + 0.3 * torch.randn(PAIRS * 2, 8, 2, 2, generator=generator)
        if rank is not None:
            vis = vis[rank * PAIRS:(rank + 1) * PAIRS]
            ir = ir[rank * PAIRS:(rank + 1) * PAIRS]
        optimizer.zero_grad()
        loss = head.loss((vis, ), (ir, ))['loss_macl']
        loss.backward()
        loss = loss.detach().clone()
        grads = {n: p.grad.clone() for n, p in head.named_parameters()}
        if rank is not None:  # what DDP does: average over ranks
            dist.all_reduce(loss)
            loss /= world
            for g in grads.values():
                dist.all_reduce(g)
                g /= world
            for n, p in head.named_parameters():
                p.grad.copy_(grads[n])
        optimizer.step()
        records.append(dict(loss=loss, grads=grads,
                            vis_center=head.vis_center.clone(),
                            ir_center=head.ir_center.clone()))
    return records


def compare_exact(reference, rank, world):
    records = exact_run(rank, world)
    for step, (ref, got) in enumerate(zip(reference, records)):
        torch.testing.assert_close(got['loss'], ref['loss'])
        for key in ('vis_center', 'ir_center'):
            torch.testing.assert_close(got[key], ref[key])
        for name, grad in ref['grads'].items():
            torch.testing.assert_close(got['grads'][name], grad,
                                       msg=lambda m: f'{name} step {step}: '
                                       f'{m}')


def main():
    reference = exact_run()  # before the process group: one process
    dist.init_process_group('gloo')
    rank = dist.get_rank()
    compare_exact(reference, rank, dist.get_world_size())
    print(f'RANK{rank} EXACT', flush=True)
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
    # barrier, then destroy, as tools/train.py ends: no gloo abort at exit
    release_process_group()


if __name__ == '__main__':
    main()

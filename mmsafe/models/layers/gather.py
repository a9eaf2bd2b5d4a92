"""All-gather of embedding rows with gradients back to their owner rank."""
from typing import Tuple

import torch
import torch.distributed as torch_dist
from mmengine.dist import get_rank, get_world_size
from torch import Tensor


class _GatherRows(torch.autograd.Function):
    """All-gather of rows (padded to the largest rank) whose backward sums
    each rank's gradient over all ranks and hands every rank the part of
    its own rows: the gradient of a loss that uses other ranks' rows flows
    back to the rank that produced them."""

    @staticmethod
    def forward(ctx, x: Tensor, sizes: Tuple[int, ...], rank: int) -> Tensor:
        ctx.sizes, ctx.rank = sizes, rank
        padded = x.new_zeros((max(sizes), *x.shape[1:]))
        padded[:x.shape[0]] = x
        buffers = [torch.zeros_like(padded) for _ in sizes]
        torch_dist.all_gather(buffers, padded)
        return torch.cat([buf[:size] for buf, size in zip(buffers, sizes)])

    @staticmethod
    def backward(ctx, grad: Tensor):
        sizes, rank = ctx.sizes, ctx.rank
        padded = grad.new_zeros((len(sizes), max(sizes), *grad.shape[1:]))
        for i, part in enumerate(grad.split(list(sizes))):
            padded[i, :sizes[i]] = part
        # Every rank runs this backward (every rank computed the loss).
        torch_dist.all_reduce(padded)
        return padded[rank, :sizes[rank]], None, None


def gather_rows(x: Tensor) -> Tuple[Tensor, int, int]:
    """All-gather ``x`` (rows may differ in number between ranks), with
    gradients back to the rank that produced each row.

    Every rank must call this, whatever its number of rows (even 0).

    Args:
        x (Tensor): ``[N, D]`` rows of this rank.

    Returns:
        tuple: the rows of all ranks in rank order, the offset of this
        rank's rows in them, and the total number of rows.
    """
    world_size = get_world_size()
    if world_size == 1:
        return x, 0, x.shape[0]
    rank = get_rank()
    num = torch.tensor([x.shape[0]], device=x.device, dtype=torch.long)
    sizes = [torch.zeros_like(num) for _ in range(world_size)]
    torch_dist.all_gather(sizes, num)
    sizes = tuple(int(s) for s in torch.cat(sizes).tolist())
    return _GatherRows.apply(x, sizes, rank), sum(sizes[:rank]), sum(sizes)

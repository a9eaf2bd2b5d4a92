"""Rank and collective helpers that work the same with and without a
process group (a single process is "rank 0 of 1" and its collectives return
their input)."""

from typing import Any, List, Optional, Sequence

import torch

def get_rank() -> int:
    """Rank of this process (0 when not distributed)."""
    from mmengine.dist import get_rank as _get_rank
    return _get_rank()


def get_world_size() -> int:
    """Number of processes (1 when not distributed)."""
    from mmengine.dist import get_world_size as _get_world_size
    return _get_world_size()


def is_distributed() -> bool:
    """Whether a default process group with more than one rank exists."""
    from mmengine.dist import is_distributed as _is_distributed
    return _is_distributed() and get_world_size() > 1


def all_reduce_sum(values: Sequence[float]) -> List[float]:
    """Sum a short list of floats over all ranks in one collective.

    float64 keeps integer counts and CRC fingerprints (< 2**32) exact.

    Args:
        values (Sequence[float]): this rank's values; every rank must pass
            the same number of values.

    Returns:
        list[float]: the element-wise sums (the input when not distributed).
    """
    if not is_distributed():
        return [float(v) for v in values]
    import torch.distributed as torch_dist
    from mmengine.dist import get_comm_device
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64,
                          device=get_comm_device())
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor.tolist()  # one device-to-host copy


def all_gather_object(obj: Any) -> List[Any]:
    """Gather a picklable object from every rank (``[obj]`` when single)."""
    if not is_distributed():
        return [obj]
    from mmengine.dist import all_gather_object as _all_gather_object
    return _all_gather_object(obj)


def current_iter() -> Optional[int]:
    """The runner's current iteration from the message hub, if any."""
    from mmengine.logging import MessageHub
    try:
        hub = MessageHub.get_current_instance()
    except Exception:  # pragma: no cover - no hub can be created
        return None
    value = hub.get_info('iter', None)
    return None if value is None else int(value)

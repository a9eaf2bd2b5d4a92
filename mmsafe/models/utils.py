"""Small tensor helpers shared by mmsafe's models."""
from typing import Iterable

from torch import Tensor
from torch.nn import Parameter


def connected_zero(params: Iterable[Parameter], *tensors: Tensor) -> Tensor:
    """An exact zero that depends on every trainable parameter in
    ``params`` and on ``tensors``, so that backward reaches all of them
    (DDP then gets a gradient, zero, for each parameter on every rank).

    Args:
        params (Iterable[Parameter]): Parameters to connect; those that do
            not require grad are left out.
        *tensors (Tensor): Further tensors to connect (e.g. features).

    Returns:
        Tensor: a scalar zero.
    """
    zero = sum(p.sum() for p in params if p.requires_grad)
    for t in tensors:
        zero = zero + t.sum()
    return zero * 0.

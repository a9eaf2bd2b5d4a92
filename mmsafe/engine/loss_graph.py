"""What a loss dict holds and what its terms reach, as MMEngine's
``parse_losses`` reads it: every key containing ``'loss'`` is summed into
the loss, the other keys are only logged.

Shared by :class:`~mmsafe.engine.hooks.LossDictLintHook`,
:class:`~mmsafe.engine.hooks.RankFaultHook` and
:class:`~mmsafe.engine.hooks.EmptyBatchSyncHook`. The autograd graph is only
inspected here, never run.
"""
from typing import Callable, Dict, Iterable, List, Optional

import torch


def is_loss_key(key: str) -> bool:
    """Whether ``parse_losses`` sums the entry ``key`` into the loss."""
    return 'loss' in key


def loss_keys(losses: Iterable[str]) -> List[str]:
    """The keys of ``losses`` that ``parse_losses`` sums, sorted."""
    return sorted(k for k in losses if is_loss_key(k))


def as_tensors(value) -> List[torch.Tensor]:
    """The tensors of a loss-dict entry (a tensor or a list of tensors)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and all(
            isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return []


def scalar_of(value) -> Optional[float]:
    """The value ``parse_losses`` logs for a loss-dict entry."""
    tensors = as_tensors(value)
    if not tensors:
        return None
    return float(sum(t.detach().float().mean() for t in tensors))


def is_close(a: float, b: float, rtol: float, atol: float) -> bool:
    """``|a - b| <= atol + rtol * max(|a|, |b|)``."""
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def walk_autograd(roots: Iterable, visit: Callable[[object], bool],
                  limit: int) -> None:
    """Call ``visit(node)`` once for every autograd node reachable from
    ``roots`` (depth first, at most ``limit`` nodes); the walk goes below a
    node only when ``visit`` returns True.

    Nodes are compared by the identity of their Python objects, which is
    only meaningful while those objects are alive: PyTorch may hand out a
    new object for a node once the previous one is gone, at a recycled
    address. So every visited node object is kept referenced for the whole
    walk.
    """
    seen: Dict[int, object] = {}
    stack = list(roots)
    while stack and len(seen) < limit:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        if visit(fn):
            stack.extend(nxt for nxt, _ in fn.next_functions)

"""Which loss terms a rank produced, iteration by iteration, and which
modules they reach.

Under DDP every rank must back-propagate into the same parameters in every
iteration: a term that one rank leaves out of its loss dict (a swallowed
exception, a branch that returns early for some batches, a constant
placeholder) leaves that branch's parameters without a gradient there, and
DDP either fails one iteration later ("Expected to have finished
reduction in the prior iteration ...") or, with
``find_unused_parameters=True``, trains on silently without that term on
that rank.

:class:`LossTermWatch` compares each iteration's terms with the rank's
earlier ones: on a healthy step it compares two small sets of key names
(no device read, no collective). Only when they differ does it walk the
autograd graph (inspected, never run) to name the modules that the loss no
longer reaches.
"""
from typing import Dict, Iterable, List, Optional, Set, Tuple

import torch
import torch.nn as nn

from mmsafe.engine.loss_graph import as_tensors, loss_keys, walk_autograd


def _requires_grad(value) -> bool:
    tensors = as_tensors(value)
    return bool(tensors) and any(t.requires_grad for t in tensors)


def reached_parameters(losses: dict, limit: int = 1000000) -> Set[int]:
    """Ids of the parameters (autograd leaves) that the loss terms of
    ``losses`` reach; the graph is only inspected."""
    roots = []
    reached: Set[int] = set()
    for key in loss_keys(losses):
        for tensor in as_tensors(losses[key]):
            if tensor.grad_fn is not None:
                roots.append(tensor.grad_fn)
            elif tensor.requires_grad:
                reached.add(id(tensor))

    def visit(fn) -> bool:
        variable = getattr(fn, 'variable', None)
        if isinstance(variable, torch.Tensor):
            reached.add(id(variable))
        return True

    walk_autograd(roots, visit, limit)
    return reached


def group_by_module(names: Iterable[str], model: nn.Module) -> List[str]:
    """The shortest description of parameter ``names`` by modules: a module
    all of whose trainable parameters are in ``names`` is named once (its
    children not); the rest by parameter, with its module.

    Returns:
        list[str]: e.g. ``['macl_head (13 parameters)',
        'roi_head.bbox_head.fc_cls.weight']``.
    """
    wanted = set(names)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    covered: Set[str] = set()
    out: List[str] = []
    for module_name, module in model.named_modules():
        prefix = f'{module_name}.' if module_name else ''
        own = [f'{prefix}{n}' for n, p in module.named_parameters()
               if p.requires_grad]
        own = [n for n in own if n in trainable]
        if not own or not module_name or any(n in covered for n in own):
            continue
        if all(n in wanted for n in own):
            covered.update(own)
            count = len(own)
            out.append(f'{module_name} ({count} parameter'
                       f'{"s" if count != 1 else ""})')
    out.extend(sorted(n for n in wanted if n not in covered))
    return out


class LossTermWatch:
    """The loss terms of one rank over a run (see the module docstring).

    Call :meth:`observe` with each training iteration's loss dict (before
    backward, while its graph is alive).
    """

    def __init__(self) -> None:
        self.known: Set[str] = set()  # every loss key seen so far
        self.with_grad: Set[str] = set()  # ... that carried a gradient
        self.first_iter: Optional[int] = None
        self.last_iter: Optional[int] = None
        self.last_keys: List[str] = []
        self.last_detached: List[str] = []
        self._last_sig: Optional[Tuple[frozenset, frozenset]] = None
        self._baseline_reached: Optional[Set[int]] = None
        self.changes: List[Dict] = []
        self.faulty = False  # the latest observed iteration differs

    def observe(self, iteration: int, losses: dict,
                params: Dict[int, str]) -> Optional[Dict]:
        """Record one iteration's loss dict.

        Args:
            iteration (int): the training iteration (1-based).
            losses (dict): the loss dict, graph alive.
            params (dict): ``id(parameter) -> name`` of the trainable
                parameters.

        Returns:
            dict or None: on a change (terms missing, new, or without
            gradient compared with this rank's earlier iterations; or back
            to normal) what changed, including the modules the loss no
            longer reaches; None when nothing changed.
        """
        keys = loss_keys(losses)
        detached = [k for k in keys if not _requires_grad(losses[k])]
        sig = (frozenset(keys), frozenset(detached))
        first = self.first_iter is None
        if first:
            self.first_iter = iteration
            self._baseline_reached = reached_parameters(losses)
        self.last_iter = iteration
        if sig == self._last_sig:
            return None
        self._last_sig = sig
        self.last_keys, self.last_detached = keys, detached
        missing = sorted(self.known - set(keys))
        new = [] if first else sorted(set(keys) - self.known)
        lost_grad = sorted(set(detached) & self.with_grad)
        self.known.update(keys)
        self.with_grad.update(k for k in keys if k not in detached)
        if first:
            return None
        faulty = bool(missing or lost_grad)
        if not faulty and not self.faulty and not new:
            return None
        unreached: List[str] = []
        if faulty and self._baseline_reached is not None:
            now = reached_parameters(losses)
            unreached = sorted(params[i] for i in self._baseline_reached
                               if i not in now and i in params)
        change = dict(iter=iteration, keys=keys, missing=missing, new=new,
                      detached=lost_grad, unreached=unreached,
                      restored=not faulty and self.faulty)
        self.faulty = faulty
        self.changes.append(change)
        return change

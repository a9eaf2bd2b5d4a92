"""Structural and numeric lint of a loss dict (as ``parse_losses`` reads
it: every key containing ``'loss'`` is summed, the others only logged)."""
import itertools
from typing import Dict, List

from mmsafe.engine.loss_graph import (as_tensors, is_close, is_loss_key,
                                      scalar_of, walk_autograd)


def depends_on(roots, targets: Dict[int, List[str]], own: str,
               limit: int = 500000) -> List[str]:
    """Names of the ``targets`` (grad_fn id -> keys) reachable from the
    autograd nodes ``roots``; the graph is only inspected, never run.

    Nodes are compared by the identity of their Python objects, which is
    only meaningful while those objects are alive: PyTorch may hand out a
    new object for a node once the previous one is gone, at a recycled
    address. So every visited node object is kept referenced (``seen``)
    for the whole walk (:func:`~mmsafe.engine.loss_graph.walk_autograd`),
    and the caller keeps the ``targets`` objects alive.
    """
    found = set()

    def visit(fn) -> bool:
        hits = [k for k in targets.get(id(fn), []) if k != own]
        found.update(hits)
        # what lies below a loss term is that term's business
        return not hits

    walk_autograd(roots, visit, limit)
    return sorted(found)


def _unoptimised(losses: dict) -> List[str]:
    return [
        f'"{key}" requires grad but its key has no "loss", so parse_losses '
        'only logs it and it is never optimised: rename it to loss_* or '
        'detach it' for key, value in losses.items()
        if 'loss' not in key and any(t.requires_grad
                                     for t in as_tensors(value))
    ]


def _computed_from_others(losses: dict, loss_keys: List[str]) -> Dict[str,
                                                                      list]:
    targets: Dict[int, List[str]] = {}
    alive = []  # the target node objects, referenced while ids are compared
    for key in loss_keys:
        for t in as_tensors(losses[key]):
            fn = t.grad_fn
            if fn is not None:
                alive.append(fn)
                targets.setdefault(id(fn), []).append(key)
    parts_of = {}
    for key in loss_keys:
        roots = [t.grad_fn for t in as_tensors(losses[key])
                 if t.grad_fn is not None]
        parts = depends_on(roots, targets, key) if roots else []
        if parts:
            parts_of[key] = parts
    return parts_of


def lint_loss_dict(losses: dict, rtol: float = 1e-4, atol: float = 1e-7,
                   max_subset_keys: int = 12) -> List[str]:
    """Findings on a loss dict, one sentence each (empty when clean).

    * an entry that requires grad without ``'loss'`` in its key (never
      optimised);
    * a loss entry computed from other loss entries (found by walking its
      autograd graph to their nodes; counted twice by ``parse_losses``);
    * a loss entry equal (``rtol``/``atol``) to the sum of a subset of the
      other non-zero entries (detached copies included). Above
      ``max_subset_keys`` other entries only pairs and the full sum are
      tried.
    """
    findings = _unoptimised(losses)
    loss_keys = [k for k in losses if is_loss_key(k)]
    flagged = _computed_from_others(losses, loss_keys)
    for key, parts in flagged.items():
        findings.append(
            f'"{key}" is computed from {parts}, which are loss entries too: '
            'parse_losses sums every key with "loss", so these terms are '
            f'counted twice. Return either "{key}" or its parts, or rename '
            'one side without "loss"')
    values = {k: scalar_of(losses[k]) for k in loss_keys}
    nonzero = {k: v for k, v in values.items()
               if v is not None and abs(v) > atol}
    for key, value in nonzero.items():
        if key in flagged:
            continue
        others = [k for k in nonzero if k != key]
        many = len(others) > max_subset_keys
        sizes = [1, 2] if many else range(1, len(others) + 1)
        subsets = itertools.chain.from_iterable(
            itertools.combinations(others, n) for n in sizes)
        if many:
            subsets = itertools.chain(subsets, [tuple(others)])
        for subset in subsets:
            total = sum(nonzero[k] for k in subset)
            if is_close(total, value, rtol, atol):
                findings.append(
                    f'"{key}" = {value:.6g} equals the sum of '
                    f'{list(subset)} ({total:.6g}): parse_losses sums every '
                    'key with "loss", so these terms are counted twice (and '
                    'the logged total is inflated)')
                break
    return findings

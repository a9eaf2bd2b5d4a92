"""Gradient norms and per-module clipping for the NaN-skip wrappers."""
import re
from typing import Dict, List, Optional, Sequence

import torch

from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError
from mmsafe.events import update_scalar


def total_norm(grads: List[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The global ``norm_type`` norm of ``grads`` (a tensor: not read)."""
    if not grads:
        return torch.tensor(0.0)
    get_total_norm = getattr(torch.nn.utils, 'get_total_norm', None)
    if get_total_norm is not None:
        return get_total_norm(grads, norm_type=norm_type,
                              error_if_nonfinite=False)
    norms = torch.stack([torch.linalg.vector_norm(g.detach(), norm_type)
                         for g in grads])
    return torch.linalg.vector_norm(norms, norm_type)


def parse_module_rules(rules: Optional[Sequence[dict]]) -> List[dict]:
    """Check and compile ``clip_grad_per_module`` entries
    (``pattern``, ``max_norm``, optional ``norm_type``)."""
    parsed = []
    for rule in rules or []:
        rule = dict(rule)
        if 'pattern' not in rule or 'max_norm' not in rule:
            raise MMSafeValueError('each clip_grad_per_module entry needs '
                                   f'`pattern` and `max_norm`, got {rule}')
        unknown = set(rule) - {'pattern', 'max_norm', 'norm_type'}
        if unknown:
            raise MMSafeValueError(f'unknown keys {sorted(unknown)} in '
                                   f'clip_grad_per_module entry {rule}')
        parsed.append(
            dict(pattern=rule['pattern'],
                 regex=re.compile(rule['pattern']),
                 max_norm=float(rule['max_norm']),
                 norm_type=float(rule.get('norm_type', 2.0))))
    return parsed


def clip_per_module(params: List[torch.Tensor], rules: List[dict],
                    param_names: Dict[int, str], message_hub) -> None:
    """Clip each rule's group of ``params`` (a parameter follows the first
    rule whose pattern its name matches) and log each group's norm as
    ``train/grad_norm_<pattern>``.

    Raises:
        RuntimeError: the parameter names are unknown.
        ValueError: a pattern matches no parameter with a gradient.
    """
    if not param_names:
        raise MMSafeRuntimeError(
            '[mmsafe] clip_grad_per_module needs the parameter names of '
            'the model; they are learnt in optim_context(), which '
            "MMEngine's train_step calls. Call optim_context(model) "
            'around the forward pass in a custom train_step.')
    groups: List[List[torch.Tensor]] = [[] for _ in rules]
    for p in params:
        name = param_names.get(id(p), '')
        for i, rule in enumerate(rules):
            if rule['regex'].search(name):
                groups[i].append(p)
                break
    for rule, group in zip(rules, groups):
        if not group:
            known = sorted({n.rsplit('.', 1)[0]
                            for n in param_names.values()})[:20]
            raise MMSafeValueError(
                f"[mmsafe] clip_grad_per_module pattern "
                f"{rule['pattern']!r} matches no parameter with a "
                f'gradient. Some module names: {known}')
        norm = torch.nn.utils.clip_grad_norm_(
            group, max_norm=rule['max_norm'], norm_type=rule['norm_type'])
        update_scalar(message_hub,
                      'train/grad_norm_{}'.format(rule['pattern']),
                      float(norm))

"""Does each configured ``loss_weight`` reach the loss?

For each submodule with a numeric, non-zero ``loss_weight`` attribute
(MMDetection's losses, the MACL head), the first batch (a deep copy) is run
again in ``loss`` mode with no grad, the RNG state and the buffers restored
before each run: once as is, once again to find the deterministic entries,
and once per weight with that weight multiplied by ``weight_scale`` (the
attribute is restored at once). A weight that changes no deterministic
entry has no effect. Every rank runs the same number of forwards whatever
the values, since a forward may hold collectives (SyncBN, gathered MACL
negatives); the RNG state is restored when the probe ends.
"""
import copy
import logging
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

from mmsafe.events import log
from mmsafe.rng import RNGState
from mmsafe.engine.loss_graph import (as_tensors, is_close, is_loss_key,
                                      scalar_of)


def weighted_modules(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``(name, module)`` of the submodules with a numeric, non-zero
    ``loss_weight``."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(getattr(m, 'loss_weight', None), (int, float))
            and not isinstance(getattr(m, 'loss_weight'), bool)
            and getattr(m, 'loss_weight') != 0]


def _loss_values(model: nn.Module, data_batch, rng: RNGState,
                 buffers: Dict[str, torch.Tensor]) -> Dict[str, float]:
    rng.restore()
    with torch.no_grad():
        data = model.data_preprocessor(copy.deepcopy(data_batch), True)
        if isinstance(data, dict):
            losses = model(**data, mode='loss')
        else:
            losses = model(*data, mode='loss')
    # Restore BatchNorm statistics and other buffers the run touched.
    for name, buf in model.named_buffers():
        if name in buffers:
            buf.copy_(buffers[name])
    return {k: v for k, v in ((k, scalar_of(v)) for k, v in losses.items()
                              if is_loss_key(k)) if v is not None}


def probe_loss_weights(model: nn.Module, data_batch, weight_scale: float,
                       rtol: float, atol: float) -> List[str]:
    """Findings (one sentence per ineffective weight) for ``model`` (the
    unwrapped model) on ``data_batch``; empty when every weight acts or
    there is nothing to probe."""
    weighted = weighted_modules(model)
    if not weighted or data_batch is None:
        return []
    rng = RNGState()
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    outputs_seen: Dict[str, List[float]] = {}
    handles = []
    for name, module in weighted:
        def record(mod, args, out, name=name):
            for t in as_tensors(out if not isinstance(out, dict) else
                                list(out.values())):
                outputs_seen.setdefault(name, []).append(
                    float(t.detach().abs().sum()))
        handles.append(module.register_forward_hook(record))
    try:
        base = _loss_values(model, data_batch, rng, buffers)
        for handle in handles:
            handle.remove()
        again = _loss_values(model, data_batch, rng, buffers)
        scaled_runs = []
        for name, module in weighted:
            original = module.loss_weight
            module.loss_weight = original * weight_scale
            try:
                scaled_runs.append(
                    _loss_values(model, data_batch, rng, buffers))
            finally:
                module.loss_weight = original
    finally:
        for handle in handles:
            handle.remove()
        rng.restore()
    stable = [k for k in base
              if k in again and is_close(base[k], again[k], rtol, atol)]
    if not stable:
        log('LossDictLintHook: the loss is not reproducible with the RNG '
            'state restored; the loss-weight probe is skipped (set '
            'check_weights=False to silence this).', logging.WARNING)
        return []
    findings = []
    for (name, module), scaled in zip(weighted, scaled_runs):
        if any(k in scaled and not is_close(base[k], scaled[k], rtol, atol)
               for k in stable):
            continue
        seen = outputs_seen.get(name)
        if seen is None:
            # e.g. a box regression loss on a batch without positive
            # samples: the head returns a zero without calling it
            log(f'LossDictLintHook: {name}.loss_weight could not be '
                'verified: the first batch does not use this loss module.')
            continue
        if sum(seen) <= atol:
            log(f'LossDictLintHook: {name}.loss_weight could not be '
                'verified: its loss term is zero on the first batch.')
            continue
        findings.append(
            f'{name}.loss_weight={module.loss_weight} has no effect: '
            f'scaling it by {weight_scale} changed none of the loss entries '
            f'{stable}. The configured weight never reaches the loss (the '
            'module ignores it, or its output is dropped or replaced)')
    return findings

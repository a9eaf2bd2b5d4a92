"""Lint the model's loss dict at the first training iteration.

:class:`LossDictLintHook` runs two checks on the loss dict as
``parse_losses`` reads it (every key containing ``'loss'`` is summed, the
others only logged): :func:`lint_loss_dict`, its structural and numeric
lint (double counting, grad-carrying entries that are never optimised),
and :func:`probe_loss_weights`, which finds the configured ``loss_weight``
attributes that never reach the loss.
"""
import copy
import itertools
import logging
import time
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.hooks import Hook

from mmsafe.registry import HOOKS

from mmsafe.dist import get_rank
from mmsafe.engine.loss_graph import (as_tensors, is_close, is_loss_key,
                                      scalar_of, walk_autograd)
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.engine.utils import unwrap_model
from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import log, update_counters, write_event
from mmsafe.rng import RNGState

_FINDINGS = 'loss_dict_lint/findings'
_POLICIES = ('warn', 'raise')


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
    there is nothing to probe.

    For each submodule with a numeric, non-zero ``loss_weight`` attribute
    (MMDetection's losses, the MACL head), the batch (a deep copy) is run
    again in ``loss`` mode with no grad, the RNG state and the buffers
    restored before each run: once as is, once again to find the
    deterministic entries, and once per weight with that weight multiplied
    by ``weight_scale`` (the attribute is restored at once). A weight that
    changes no deterministic entry has no effect. Every rank runs the same
    number of forwards whatever the values, since a forward may hold
    collectives (SyncBN, gathered MACL negatives); the RNG state is
    restored when the probe ends.
    """
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


@HOOKS.register_module()
class LossDictLintHook(Hook):
    """Check the loss dict of the first training iteration for mistakes
    that silently change what is optimised.

    MMEngine's ``parse_losses`` sums every entry whose key contains
    ``'loss'`` and only logs the others. Three mistakes follow from it:

    1. **Double counting**: a ``'loss'`` key computed from other loss keys
       (a ``loss_total = a * loss_a + b * loss_b`` next to ``loss_a`` and
       ``loss_b``) is summed again, so terms count twice and the weights do
       not mean what the config says. Detected structurally, by walking the
       autograd graph of each loss entry (never executing it) to the other
       entries' nodes, which also catches weighted sums; and numerically,
       when an entry equals the sum of a subset of the other entries (rtol
       ``rtol``), which also catches detached copies.
    2. **Never optimised**: an entry that requires grad but has no
       ``'loss'`` in its key is logged, never back-propagated.
    3. **Loss weights that never reach the loss**: for each submodule with
       a numeric ``loss_weight`` attribute (MMDetection's losses, MACL), the
       first batch (a deep copy) is run again in ``loss`` mode with no grad,
       RNG state and buffers restored before each run, once as is, once
       again to find the keys that are deterministic, and once with that
       weight multiplied by ``weight_scale``. When no deterministic loss
       entry changes, the weight has no effect. Not detected: a weight
       stored elsewhere than ``loss_weight``; a term that is zero on the
       first batch is reported as unverifiable (when the module's forward
       shows it), not as an error. The extra forwards run once, after the
       first optimizer step; the RNG state is restored afterwards, so the
       rest of the run draws the same random numbers as without the lint.

    Each rank logs its own findings at once. Their count travels with
    mmsafe's other monitoring values (:class:`MonitorSync`: at
    the same iteration in a single process, at the first log interval under
    DDP), so with ``policy='raise'`` every rank raises at the same
    iteration, and a rank without findings of its own says which ranks had
    them.

    Args:
        policy (str): ``'raise'`` (default) or ``'warn'``.
        check_weights (bool): Run the loss-weight probe. Defaults to True.
        weight_scale (float): Factor applied to each weight. Defaults to 2.
        rtol (float): Relative tolerance of value comparisons. Defaults to
            1e-4.
        atol (float): Absolute tolerance; entries smaller than it count as
            zero. Defaults to 1e-7.
        max_subset_keys (int): Above this many non-zero loss entries only
            pairs and the full sum are tried numerically. Defaults to 12.
    """

    guard_outputs = GuardOutputs(
        Section.OTHER,
        events=(Event.LOSS_DICT_LINT, ),
        counters=(CounterKey.LOSS_DICT_LINT, ))

    priority = 'NORMAL'

    def __init__(self,
                 policy: str = 'raise',
                 check_weights: bool = True,
                 weight_scale: float = 2.0,
                 rtol: float = 1e-4,
                 atol: float = 1e-7,
                 max_subset_keys: int = 12) -> None:
        if policy not in _POLICIES:
            raise MMSafeValueError(f'LossDictLintHook.policy must be one of '
                                   f'{_POLICIES}, got {policy!r}')
        self.policy = policy
        self.check_weights = check_weights
        self.weight_scale = weight_scale
        self.rtol = rtol
        self.atol = atol
        self.max_subset_keys = max_subset_keys
        self._handle = None
        self._findings: Optional[List[str]] = None
        self._keys: List[str] = []
        self._done = False
        self._decided = False
        self.last_findings: List[str] = []
        self._sync = None

    # ------------------------------------------------------------------ #
    def before_run(self, runner) -> None:
        self._sync = monitor_sync_of(runner)
        self._sync.declare(_FINDINGS)

    def before_train(self, runner) -> None:
        if self._done:
            return
        model = unwrap_model(runner.model)
        self._handle = model.register_forward_hook(
            self._capture, with_kwargs=True)

    def _capture(self, module, args, kwargs, output) -> None:
        mode = kwargs.get('mode', args[2] if len(args) > 2 else None)
        if mode != 'loss' or not isinstance(output, dict):
            return
        self._handle.remove()
        self._handle = None
        self._keys = list(output)
        self._findings = lint_loss_dict(output, self.rtol, self.atol,
                                        self.max_subset_keys)

    # ------------------------------------------------------------------ #
    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if not self._done:
            self._done = True
            self._lint(runner, data_batch)
        if not self._decided and self._sync.sync(runner):
            self._decided = True
            self._decide(runner)

    def _lint(self, runner, data_batch) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        findings = list(self._findings or [])
        if self._findings is None:
            findings.append('the model was never called in loss mode during '
                            'the first iteration, so its loss dict could not '
                            'be linted')
        start = time.perf_counter()
        if self.check_weights:
            findings.extend(probe_loss_weights(
                unwrap_model(runner.model), data_batch, self.weight_scale,
                self.rtol, self.atol))
        probe_s = time.perf_counter() - start
        findings = list(dict.fromkeys(findings))
        self.last_findings = findings
        self._sync.post(_FINDINGS, float(len(findings)))
        update_counters(CounterKey.LOSS_DICT_LINT, findings=len(findings),
                        keys=self._keys)
        message = (f'LossDictLintHook (rank {get_rank()}) found '
                   f'{len(findings)} problem(s) in the loss dict '
                   f'{self._keys}:\n  - ' + '\n  - '.join(findings)
                   ) if findings else None
        write_event(runner.work_dir, Event.LOSS_DICT_LINT, message,
                    logging.ERROR, findings=findings, keys=self._keys,
                    weight_probe_s=round(probe_s, 3))
        if not findings:
            log(f'LossDictLintHook: loss dict {self._keys} is clean '
                '(no double counting, every grad-carrying entry is a loss'
                + (f', every loss_weight reaches the loss; probe '
                   f'{probe_s:.1f} s' if self.check_weights else '') + ').')

    def _decide(self, runner) -> None:
        sync = self._sync
        total = int(sync.last(_FINDINGS))
        if total == 0 or self.policy != 'raise':
            return
        ranks = sync.last_count(_FINDINGS)
        mine = self.last_findings
        message = (f'LossDictLintHook found {total} problem(s) in the loss '
                   f'dict of the first iteration over {ranks} rank(s); '
                   + (f'rank {get_rank()}:\n  - ' + '\n  - '.join(mine)
                      if mine else f'rank {get_rank()} found none itself, '
                      'see the other ranks\' logs'))
        raise MMSafeRuntimeError(f'[mmsafe] {message}\nSet LossDictLintHook '
                                 "policy='warn' to only log this.")

"""Lint the model's loss dict at the first training iteration."""
import copy
import itertools
import logging
import time
from typing import Dict, List, Optional, Tuple

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmdet.registry import HOOKS

from mmsafe.dist import get_rank
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.events import log, update_counters, write_event
from mmsafe.rng import RNGState

_FINDINGS = 'loss_dict_lint/findings'
_POLICIES = ('warn', 'raise')


def _as_tensors(value) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and all(
            isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return []


def _scalar(value) -> Optional[float]:
    """The value ``parse_losses`` logs for a loss-dict entry."""
    tensors = _as_tensors(value)
    if not tensors:
        return None
    return float(sum(t.detach().float().mean() for t in tensors))


def _depends_on(roots, targets: Dict[int, List[str]], own: str,
                limit: int = 500000) -> List[str]:
    """Names of the ``targets`` (grad_fn id -> keys) reachable from the
    autograd nodes ``roots``; the graph is only inspected, never run."""
    found, seen, stack = set(), set(), list(roots)
    while stack and len(seen) < limit:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        hits = [k for k in targets.get(id(fn), []) if k != own]
        if hits:
            found.update(hits)
            continue  # what lies below a loss term is that term's business
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return sorted(found)


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

    priority = 'NORMAL'

    def __init__(self,
                 policy: str = 'raise',
                 check_weights: bool = True,
                 weight_scale: float = 2.0,
                 rtol: float = 1e-4,
                 atol: float = 1e-7,
                 max_subset_keys: int = 12) -> None:
        if policy not in _POLICIES:
            raise ValueError(f'LossDictLintHook.policy must be one of '
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

    @staticmethod
    def _unwrap(runner):
        return runner.model.module if is_model_wrapper(
            runner.model) else runner.model

    # ------------------------------------------------------------------ #
    def before_run(self, runner) -> None:
        self._sync = monitor_sync_of(runner)
        self._sync.declare(_FINDINGS)

    def before_train(self, runner) -> None:
        if self._done:
            return
        model = self._unwrap(runner)
        self._handle = model.register_forward_hook(
            self._capture, with_kwargs=True)

    def _capture(self, module, args, kwargs, output) -> None:
        mode = kwargs.get('mode', args[2] if len(args) > 2 else None)
        if mode != 'loss' or not isinstance(output, dict):
            return
        self._handle.remove()
        self._handle = None
        self._keys = list(output)
        self._findings = self._lint_structure(output)

    def _close(self, a: float, b: float) -> bool:
        return abs(a - b) <= self.atol + self.rtol * max(abs(a), abs(b))

    def _lint_structure(self, losses: dict) -> List[str]:
        findings = []
        loss_keys = [k for k in losses if 'loss' in k]
        for key, value in losses.items():
            if 'loss' in key:
                continue
            if any(t.requires_grad for t in _as_tensors(value)):
                findings.append(
                    f'"{key}" requires grad but its key has no "loss", so '
                    'parse_losses only logs it and it is never optimised: '
                    'rename it to loss_* or detach it')
        # Structural: which loss entries are computed from other entries.
        targets: Dict[int, List[str]] = {}
        for key in loss_keys:
            for t in _as_tensors(losses[key]):
                if t.grad_fn is not None:
                    targets.setdefault(id(t.grad_fn), []).append(key)
        flagged = set()
        for key in loss_keys:
            roots = [t.grad_fn for t in _as_tensors(losses[key])
                     if t.grad_fn is not None]
            parts = _depends_on(roots, targets, key) if roots else []
            if parts:
                flagged.add(key)
                findings.append(
                    f'"{key}" is computed from {parts}, which are loss '
                    'entries too: parse_losses sums every key with "loss", '
                    f'so these terms are counted twice. Return either "{key}" '
                    'or its parts, or rename one side without "loss"')
        # Numeric: equal to the sum of a subset of the other entries.
        values = {k: _scalar(losses[k]) for k in loss_keys}
        nonzero = {k: v for k, v in values.items()
                   if v is not None and abs(v) > self.atol}
        for key, value in nonzero.items():
            if key in flagged:
                continue
            others = [k for k in nonzero if k != key]
            if len(others) <= self.max_subset_keys:
                sizes = range(1, len(others) + 1)
            else:
                sizes = [1, 2]
            subsets = itertools.chain.from_iterable(
                itertools.combinations(others, n) for n in sizes)
            if len(others) > self.max_subset_keys:
                subsets = itertools.chain(subsets, [tuple(others)])
            for subset in subsets:
                total = sum(nonzero[k] for k in subset)
                if self._close(total, value):
                    findings.append(
                        f'"{key}" = {value:.6g} equals the sum of '
                        f'{list(subset)} ({total:.6g}): parse_losses sums '
                        'every key with "loss", so these terms are counted '
                        'twice (and the logged total is inflated)')
                    break
        return findings

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
            findings.extend(self._probe_weights(runner, data_batch))
        probe_s = time.perf_counter() - start
        findings = list(dict.fromkeys(findings))
        self.last_findings = findings
        self._sync.post(_FINDINGS, float(len(findings)))
        update_counters('loss_dict_lint', findings=len(findings),
                        keys=self._keys)
        write_event(runner.work_dir, 'loss_dict_lint', findings=findings,
                    keys=self._keys, weight_probe_s=round(probe_s, 3))
        if not findings:
            log(f'LossDictLintHook: loss dict {self._keys} is clean '
                '(no double counting, every grad-carrying entry is a loss'
                + (f', every loss_weight reaches the loss; probe '
                   f'{probe_s:.1f} s' if self.check_weights else '') + ').')
            return
        log(f'LossDictLintHook (rank {get_rank()}) found {len(findings)} '
            f'problem(s) in the loss dict {self._keys}:\n  - ' +
            '\n  - '.join(findings), logging.ERROR)

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
        raise RuntimeError(f'[mmsafe] {message}\nSet LossDictLintHook '
                           "policy='warn' to only log this.")

    # ------------------------------------------------------------------ #
    def _loss_values(self, model, data_batch, rng: RNGState,
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
        return {
            k: v
            for k, v in ((k, _scalar(v)) for k, v in losses.items()
                         if 'loss' in k) if v is not None
        }

    def _probe_weights(self, runner, data_batch) -> List[str]:
        model = self._unwrap(runner)
        weighted: List[Tuple[str, torch.nn.Module]] = [
            (name, m) for name, m in model.named_modules()
            if isinstance(getattr(m, 'loss_weight', None), (int, float))
            and not isinstance(getattr(m, 'loss_weight'), bool)
            and getattr(m, 'loss_weight') != 0
        ]
        if not weighted or data_batch is None:
            return []
        rng = RNGState()
        buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        outputs_seen: Dict[str, List[float]] = {}
        handles = []
        for name, module in weighted:
            def record(mod, args, out, name=name):
                for t in _as_tensors(out if not isinstance(out, dict) else
                                     list(out.values())):
                    outputs_seen.setdefault(name, []).append(
                        float(t.detach().abs().sum()))
            handles.append(module.register_forward_hook(record))
        findings = []
        try:
            # The same number of forwards on every rank, whatever the
            # values (a forward may hold collectives: SyncBN, gathered
            # MACL negatives).
            base = self._loss_values(model, data_batch, rng, buffers)
            for handle in handles:
                handle.remove()
            again = self._loss_values(model, data_batch, rng, buffers)
            scaled_runs = []
            for name, module in weighted:
                original = module.loss_weight
                module.loss_weight = original * self.weight_scale
                try:
                    scaled_runs.append(
                        self._loss_values(model, data_batch, rng, buffers))
                finally:
                    module.loss_weight = original
            stable = [k for k in base if k in again
                      and self._close(base[k], again[k])]
            if not stable:
                log('LossDictLintHook: the loss is not reproducible with the '
                    'RNG state restored; the loss-weight probe is skipped '
                    '(set check_weights=False to silence this).',
                    logging.WARNING)
                return []
            for (name, module), scaled in zip(weighted, scaled_runs):
                changed = [k for k in stable if k in scaled
                           and not self._close(base[k], scaled[k])]
                if changed:
                    continue
                seen = outputs_seen.get(name)
                if seen is not None and sum(seen) <= self.atol:
                    log(f'LossDictLintHook: {name}.loss_weight could not be '
                        'verified: its loss term is zero on the first batch.')
                    continue
                findings.append(
                    f'{name}.loss_weight={module.loss_weight} has no effect: '
                    f'scaling it by {self.weight_scale} changed none of the '
                    f'loss entries {stable}. The configured weight never '
                    'reaches the loss (the module ignores it, or its output '
                    'is dropped or replaced)')
        finally:
            for handle in handles:
                handle.remove()
            rng.restore()
        return findings

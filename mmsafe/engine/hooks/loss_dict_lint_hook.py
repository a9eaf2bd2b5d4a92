"""Lint the model's loss dict at the first training iteration."""
import logging
import time
from typing import List, Optional

from mmengine.hooks import Hook

from mmsafe.registry import HOOKS

from mmsafe.dist import get_rank
from mmsafe.engine.loss_dict_lint.lint import lint_loss_dict
from mmsafe.engine.loss_dict_lint.weight_probe import probe_loss_weights
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.engine.utils import unwrap_model
from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import log, update_counters, write_event

_FINDINGS = 'loss_dict_lint/findings'
_POLICIES = ('warn', 'raise')


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

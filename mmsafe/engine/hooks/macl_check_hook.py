"""Check that the MACL loss exists, is sane, and learns beyond chance."""
import logging
import math
from typing import Optional

import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmdet.registry import HOOKS

from mmsafe.dist import MonitorSync, get_rank, get_world_size
from mmsafe.events import log, update_counters, write_event

_POLICIES = ('warn', 'raise')
_PREFIX = 'macl_check/'
# Values every rank posts to the monitor sync (declared in __init__).
_NAMES = ('seen', 'missing', 'nonfinite', 'zero', 'ratio_sum', 'ratio_count',
          'gap_sum', 'gap_count')


@HOOKS.register_module()
class MACLCheckHook(Hook):
    """Watch the cross-modal MACL loss from the first iteration on.

    Three checks, each aimed at a failure that once went unnoticed for days:

    1. Presence (first ``check_iters`` iterations): ``loss_key`` must be in
       the loss dict on every rank, finite, and non-zero (a zero is excused
       when the MACL head had fewer than 2 pairs to contrast). Each rank
       posts its flags to :class:`~mmsafe.dist.MonitorSync`; at the next
       sync (every iteration in a single process, the log interval under
       DDP) all ranks see the same sums and warn or raise together; none
       hangs.
    2. Chance level: an InfoNCE over ``B`` candidates sits at ``ln(B)`` when
       the embeddings carry no pairing information. ``train/macl_chance_
       ratio`` = unweighted loss / ln(B) is logged every iteration (by the
       MACL head itself when it returns ``macl_chance_ratio``, as mmsafe's
       ``MACLHead`` does; else by this hook). The hook warns when its mean
       over ranks and ``chance_window`` iterations after ``chance_warmup``
       iterations is at or above ``chance_threshold``: pairing broken or
       modalities misaligned.
    3. Shuffled-pair control (``control_interval`` > 0): every K iterations,
       with no grad and the head in eval mode, ``head.embed`` embeds the
       batch's visible and infrared features and compares the mean cosine
       similarity of true pairs with that of mismatched pairs (infrared rolled by one within the batch).
       After ``control_warmup`` iterations it warns when true pairs are not
       better by at least ``control_margin``.

    Every value is read from what MMEngine logged for the iteration (no
    device read of its own). For a head that does not return
    ``macl_chance_ratio``, ``B`` is the head's ``last_num_pairs``, else
    ``num_pairs`` (or the batch size), and the loss is divided by the
    head's ``loss_weight`` (or ``loss_weight``).

    Args:
        loss_key (str): Key of the MACL loss. Defaults to ``'loss_macl'``.
        check_iters (int): Iterations in which presence is checked.
            Defaults to 10.
        policy (str): ``'raise'`` (default) or ``'warn'`` for a failed
            presence check.
        head (str, optional): Attribute path of the MACL head in the
            unwrapped model (e.g. ``'macl_head'``). Default: the first
            submodule with a ``last_num_pairs`` attribute.
        num_pairs (int, optional): ``B`` when the head does not tell.
        loss_weight (float, optional): Weight of the loss when the head
            does not tell (default 1.0).
        chance_warmup (int): Iterations before the chance check. Defaults
            to 50.
        chance_window (int): Iterations averaged per chance check. Defaults
            to 20.
        chance_threshold (float): Ratio at or above which the loss counts
            as chance. Defaults to 0.95.
        control_interval (int): Run the shuffled-pair control every K
            iterations; 0 disables it. Defaults to 0.
        control_warmup (int): Iterations before a control can warn.
            Defaults to 50.
        control_margin (float): Required cosine-similarity advantage of
            true over mismatched pairs. Defaults to 0.05.
        required (bool): Check even when the model has no MACL head (no
            submodule with ``last_num_pairs`` and no ``head``). By default
            such a model turns the hook off, logged once, so the hook can
            sit in a shared runtime config. Defaults to False.
    """

    priority = 'NORMAL'

    def __init__(self,
                 loss_key: str = 'loss_macl',
                 check_iters: int = 10,
                 policy: str = 'raise',
                 head: Optional[str] = None,
                 num_pairs: Optional[int] = None,
                 loss_weight: Optional[float] = None,
                 chance_warmup: int = 50,
                 chance_window: int = 20,
                 chance_threshold: float = 0.95,
                 control_interval: int = 0,
                 control_warmup: int = 50,
                 control_margin: float = 0.05,
                 required: bool = False) -> None:
        if policy not in _POLICIES:
            raise ValueError(f'MACLCheckHook.policy must be one of '
                             f'{_POLICIES}, got {policy!r}')
        self.loss_key = loss_key
        self.check_iters = check_iters
        self.policy = policy
        self.head_path = head
        self.num_pairs = num_pairs
        self.loss_weight = loss_weight
        self.chance_warmup = chance_warmup
        self.chance_window = max(1, chance_window)
        self.chance_threshold = chance_threshold
        self.control_interval = control_interval
        self.control_warmup = control_warmup
        self.control_margin = control_margin

        sync = MonitorSync.get()
        for name in _NAMES:
            sync.declare(_PREFIX + name)
        self.required = required
        self._active = True
        self._head = None
        self._presence_open = True
        self._window_sum = 0.0
        self._window_count = 0
        self._control_armed = False
        self._control_result: Optional[tuple] = None
        self._logged = set()
        self._streaks = {}
        self.stats = dict(presence_failures=0, chance_warnings=0,
                          control_runs=0, control_warnings=0)

    # ------------------------------------------------------------------ #
    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self._head = self._find_head(model)
        if self._head is None and not self.required:
            # Decided from the model's structure, identical on every rank.
            self._active = False
            self._log_once(
                'inactive', 'MACLCheckHook: the model has no MACL head (no '
                'submodule with last_num_pairs), so the MACL checks are off. '
                'Set MACLCheckHook required=True (and num_pairs) to demand '
                f'{self.loss_key} anyway, or remove the hook.',
                logging.WARNING)
            return
        self._active = True
        if self._head is None:
            self._log_once(
                'nohead', 'MACLCheckHook: no MACL head found in the model; '
                'B comes from num_pairs or the batch size and the '
                'shuffled-pair control is off.', logging.WARNING)
        elif self.control_interval > 0:
            self._wrap_head_loss(self._head)

    def _find_head(self, model):
        if self.head_path:
            head = model
            for part in self.head_path.split('.'):
                head = getattr(head, part)
            return head
        for module in model.modules():
            if hasattr(module, 'last_num_pairs'):
                return module
        return None

    def _wrap_head_loss(self, head) -> None:
        """Capture the features the head scores, for the control."""
        can_embed = callable(getattr(head, 'embed', None)) or all(
            hasattr(head, a) for a in ('vis_projector', 'ir_projector'))
        if not (can_embed and callable(getattr(head, '_select', None))):
            self._log_once(
                'nocontrol', 'MACLCheckHook: the MACL head has neither '
                'embed(vis_feat, ir_feat) nor vis_/ir_projector, or no '
                '_select(); the shuffled-pair control is off (set '
                'control_interval=0 to silence this).', logging.WARNING)
            self.control_interval = 0
            return
        original = head.loss

        def loss_with_control(vis_feats, ir_feats, *args, **kwargs):
            if self._control_armed:
                self._control_armed = False
                self._control_result = self._score_pairs(
                    head, vis_feats, ir_feats)
            return original(vis_feats, ir_feats, *args, **kwargs)

        head.loss = loss_with_control

    @staticmethod
    @torch.no_grad()
    def _score_pairs(head, vis_feats, ir_feats) -> Optional[tuple]:
        vis = head._select(vis_feats, 'visible').detach()
        ir = head._select(ir_feats, 'infrared').detach()
        if vis.shape[0] < 2:
            return None
        # Eval mode: embedding must not update the head's running state
        # (e.g. MACLHead's feature centres); it has no dropout or BN.
        was_training = head.training
        head.train(False)
        try:
            if callable(getattr(head, 'embed', None)):
                v, r = head.embed(vis, ir)
            else:  # a head without embed(): pool, project, normalise
                pool = (F.adaptive_max_pool2d if getattr(
                    head, 'pooling', 'avg') == 'max' else
                        F.adaptive_avg_pool2d)
                v = F.normalize(
                    head.vis_projector(pool(vis, 1).flatten(1)), dim=1)
                r = F.normalize(
                    head.ir_projector(pool(ir, 1).flatten(1)), dim=1)
        finally:
            head.train(was_training)
        true_sim = (v * r).sum(1).mean().item()
        # Each visible image against its neighbour's infrared image.
        mismatched_sim = (v * r.roll(1, dims=0)).sum(1).mean().item()
        return true_sim, mismatched_sim

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        if (self._active and self.control_interval > 0
                and (runner.iter + 1) % self.control_interval == 0):
            self._control_armed = True

    # ------------------------------------------------------------------ #
    @staticmethod
    def _logged_value(runner, outputs: dict, key: str) -> Optional[float]:
        """This iteration's value of ``outputs[key]`` as MMEngine logged it
        (``RuntimeInfoHook`` already read it from the device), or None."""
        if key not in outputs:
            return None
        buffer = runner.message_hub.log_scalars.get(f'train/{key}')
        if buffer is not None:
            return float(buffer.current())
        return float(torch.as_tensor(outputs[key]).detach())

    def _chance_ratio(self, runner, outputs: dict, value: float,
                      data_batch) -> Optional[float]:
        logged = self._logged_value(runner, outputs, 'macl_chance_ratio')
        if logged is not None:
            return logged
        num = self.num_pairs
        weight = self.loss_weight
        if self._head is not None:
            num = num or getattr(self._head, 'last_num_pairs', None)
            if weight is None:
                weight = getattr(self._head, 'loss_weight', None)
        if not num and isinstance(data_batch, dict):
            num = len(data_batch.get('data_samples') or [])
        weight = 1.0 if weight is None else float(weight)
        if not num or num < 2 or weight == 0:
            return None
        ratio = value / weight / math.log(num)
        runner.message_hub.update_scalar('train/macl_chance_ratio', ratio)
        return ratio

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if not self._active:
            return
        iteration = runner.iter + 1
        outputs = outputs or {}
        sync = MonitorSync.get()
        value = self._logged_value(runner, outputs, self.loss_key)
        if self._presence_open and runner.iter < self.check_iters:
            excused = (self._head is not None and
                       getattr(self._head, 'last_num_pairs', 2) < 2)
            flags = dict(
                missing=value is None,
                nonfinite=value is not None and not math.isfinite(value),
                zero=value == 0.0 and not excused)
            sync.post(_PREFIX + 'seen', 1.0)
            for name, flag in flags.items():
                sync.post(_PREFIX + name, 1.0 if flag else 0.0)
            bad = [name for name, flag in flags.items() if flag]
            if bad and f'local_{bad[0]}' not in self._logged:
                # This rank's own view at once; the decision (warn or raise
                # on every rank) is taken at the next sync.
                write_event(runner.work_dir, 'macl_presence_local',
                            iter=iteration, problem=bad[0])
                self._log_once(
                    f'local_{bad[0]}', f'MACLCheckHook: rank {get_rank()} '
                    f'sees {self.loss_key} {bad[0]} at iteration '
                    f'{iteration}; every rank decides at the next sync '
                    '(the log interval under DDP).', logging.WARNING)
        if value is not None and math.isfinite(value):
            ratio = self._chance_ratio(runner, outputs, value, data_batch)
            if ratio is not None and math.isfinite(ratio):
                sync.post(_PREFIX + 'ratio_sum', ratio)
                sync.post(_PREFIX + 'ratio_count', 1.0)
        if self._control_result is not None:
            true_sim, mismatched_sim = self._control_result
            self._control_result = None
            sync.post(_PREFIX + 'gap_sum', true_sim - mismatched_sim)
            sync.post(_PREFIX + 'gap_count', 1.0)
        # Every rank, every iteration: a collective only when due.
        if sync.sync(runner):
            self._evaluate(runner, sync, iteration, data_batch)

    # ------------------------------------------------------------------ #
    def _evaluate(self, runner, sync, iteration: int, data_batch) -> None:
        last = lambda name: sync.last(_PREFIX + name)  # noqa: E731
        if self._presence_open:
            if last('seen') > 0:
                self._check_presence(runner, iteration, last, data_batch)
            if runner.iter + 1 >= self.check_iters:
                self._presence_open = False
        count = last('ratio_count')
        if count > 0:
            if iteration > self.chance_warmup:
                # Sums over ranks and the iterations since the last sync.
                self._window_sum += last('ratio_sum')
                self._window_count += int(count)
                if (self._window_count >=
                        self.chance_window * get_world_size()):
                    self._check_chance(runner, iteration)
        if last('gap_count') > 0:
            self._check_control(runner, iteration,
                                last('gap_sum') / last('gap_count'))

    def _check_presence(self, runner, iteration, last, data_batch) -> None:
        world = get_world_size()
        problems = []
        if last('missing') > 0:
            problems.append(f'{self.loss_key} is missing from the loss dict '
                            f'({int(last("missing"))} rank-iteration(s) of '
                            f'{int(last("seen"))} checked, world size '
                            f'{world})')
        if last('nonfinite') > 0:
            problems.append(f'{self.loss_key} is not finite '
                            f'({int(last("nonfinite"))} time(s))')
        if last('zero') > 0:
            problems.append(f'{self.loss_key} is exactly 0 with >= 2 pairs '
                            f'({int(last("zero"))} time(s)): loss_weight=0 '
                            'or a detached fallback')
        if not problems:
            return
        self.stats['presence_failures'] += 1
        update_counters('macl_check', **self.stats)
        from mmsafe.events import batch_file_names
        message = (f'MACLCheckHook at iteration {iteration} (rank '
                   f'{get_rank()}): ' + '; '.join(problems) + '. The '
                   'cross-modal loss is not training: check that the model '
                   'has a macl_head and gets paired inputs on every rank.')
        write_event(runner.work_dir, 'macl_presence', iter=iteration,
                    problems=problems, policy=self.policy,
                    files=batch_file_names(data_batch))
        if self.policy == 'raise':
            raise RuntimeError(f'[mmsafe] {message} Set MACLCheckHook '
                               "policy='warn' to only log this.")
        if self.stats['presence_failures'] == 1:
            log(message + ' (logged once; every occurrence is in '
                'mmsafe_events.jsonl)', logging.ERROR)

    def _check_chance(self, runner, iteration: int) -> None:
        mean = self._window_sum / self._window_count
        window = self._window_count // get_world_size()
        self._window_sum, self._window_count = 0.0, 0
        update_counters('macl_check', chance_ratio=mean)
        if mean < self.chance_threshold:
            self._streaks['chance'] = 0
            return
        self.stats['chance_warnings'] += 1
        update_counters('macl_check', **self.stats)
        write_event(runner.work_dir, 'macl_chance', iter=iteration,
                    ratio=mean, window=window,
                    threshold=self.chance_threshold)
        self._warn_streak(
            'chance', f'MACLCheckHook: {self.loss_key} is at chance level at '
            f'iteration {iteration}: mean loss / ln(B) = {mean:.3f} over the '
            f'last {window} iterations (threshold {self.chance_threshold}). '
            'The visible and infrared embeddings carry no pairing '
            'information: check that pairs are matched (same file stem) and '
            'that both modalities get identical geometric transforms.')

    def _check_control(self, runner, iteration: int, gap: float) -> None:
        self.stats['control_runs'] += 1
        update_counters('macl_check', control_gap=gap, **self.stats)
        write_event(runner.work_dir, 'macl_control', iter=iteration, gap=gap)
        if iteration <= self.control_warmup or gap >= self.control_margin:
            self._streaks['control'] = 0
            return
        self.stats['control_warnings'] += 1
        update_counters('macl_check', **self.stats)
        self._warn_streak(
            'control', f'MACLCheckHook: shuffled-pair control at iteration '
            f'{iteration}: true pairs are only {gap:+.3f} more similar '
            f'(cosine) than mismatched pairs (margin {self.control_margin}). '
            'The model cannot tell true visible/infrared pairs from shuffled '
            'ones.')

    def _warn_streak(self, kind: str, message: str) -> None:
        """Warn at the 1st, 2nd, 4th, 8th ... consecutive occurrence, so a
        long run at chance does not flood the log."""
        streak = self._streaks.get(kind, 0) + 1
        self._streaks[kind] = streak
        if streak & (streak - 1) == 0:
            suffix = '' if streak == 1 else (
                f' ({streak} checks in a row; logged at powers of two, all '
                'in mmsafe_events.jsonl)')
            log(message + suffix, logging.WARNING)

    def _log_once(self, key: str, message: str, level: int) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log(message, level)

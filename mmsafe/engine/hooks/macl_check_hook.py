"""Check the cross-modal MACL loss for the whole run: present, alive,
reaching its parameters, and better than chance."""
import logging
import math
from typing import Dict, List, Optional

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmdet.registry import HOOKS
from mmsafe.dist import get_rank, get_world_size
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.events import (batch_file_names, log, update_counters,
                           write_event)

_POLICIES = ('warn', 'raise')
_PREFIX = 'macl_check/'
#: Problems of the loss itself, checked every iteration on every rank.
_PROBLEMS = ('missing', 'nonfinite', 'zero', 'constant', 'unreached')
# Values every rank posts to the monitor sync (declared in before_run).
_NAMES = ('seen', ) + _PROBLEMS + ('ratio_sum', 'ratio_count', 'gap_sum',
                                    'gap_count')
_DESCRIBE = dict(
    missing='is missing from the loss dict',
    nonfinite='is not finite',
    zero='is exactly 0 with >= 2 pairs to contrast (loss_weight=0 or a '
    'detached fallback)',
    constant='has not changed for {n} iterations (a constant or detached '
    'fallback)',
    unreached='no longer reaches the MACL head: its parameters did not '
    'change while the rest of the model trained (a detached loss)')


def _tensors_version(params) -> tuple:
    # In-place updates (optimizer steps) bump a tensor's version counter:
    # a change is seen without reading any value from the device.
    return tuple(p._version for p in params)


@HOOKS.register_module()
class MACLCheckHook(Hook):
    """Watch the cross-modal MACL loss on every rank, for the whole run.

    Everything is read from what MMEngine logged for the iteration (the
    loss dict's values, already on the host): no device read, no call into
    the model. Each rank posts what it saw to
    :class:`MonitorSync`; at the next sync (every iteration in
    a single process, the log interval under DDP) every rank sees the same
    sums and warns or raises together, naming the iteration; none hangs.

    1. The loss is alive, every iteration: ``loss_key`` must be in the loss
       dict, finite, non-zero (excused when the iteration had fewer than 2
       candidates to contrast: the head then logs no ``macl_chance_ratio``),
       not constant (the same value ``constant_iters`` iterations in a
       row), and it must reach the MACL head: the head's trainable
       parameters must change while the rest of the model trains (checked
       at each sync from the tensors' version counters). A rank logs its
       own first problem of each kind at once (and in
       ``mmsafe_events.jsonl``, ``macl_presence_local``).
    2. Chance level: an InfoNCE over ``B`` candidates sits at ``ln(B)`` when
       the embeddings carry no pairing information. ``train/macl_chance_
       ratio`` = unweighted loss / ln(B) is logged every iteration (by the
       MACL head when it returns ``macl_chance_ratio``, as mmsafe's
       ``MACLHead`` does; else by this hook). The hook warns when its mean
       over ranks and ``chance_window`` iterations after ``chance_warmup``
       iterations is at or above ``chance_threshold``: pairing broken or
       modalities misaligned.
    3. Shuffled-pair control (``control_interval`` > 0): the head's
       ``macl_pair_gap`` (mean cosine similarity of the true pairs minus
       that of mismatched pairs) is averaged over ranks and
       ``control_interval`` iterations; after ``control_warmup`` iterations
       the verdict fails when the gap is below ``control_margin``. Every
       verdict is logged, in ``mmsafe_events.jsonl`` (``macl_control``) and
       in ``safety_report.json`` (``mmsafe/macl_check``).

    For a head that does not return ``macl_chance_ratio``, ``B`` is the
    head's ``last_num_pairs``, else ``num_pairs`` (or the batch size), and
    the loss is divided by the head's ``loss_weight`` (or ``loss_weight``).

    Args:
        loss_key (str): Key of the MACL loss. Defaults to ``'loss_macl'``.
        policy (str): ``'warn'`` (default) or ``'raise'`` for a loss that
            is missing, not finite, zero, constant or unreached.
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
        control_interval (int): Iterations per shuffled-pair verdict; 0
            disables it. Defaults to 0.
        control_warmup (int): Iterations before a verdict can fail.
            Defaults to 50.
        control_margin (float): Required cosine-similarity advantage of
            true over mismatched pairs. Defaults to 0.05.
        constant_iters (int): Equal consecutive values that count as a
            constant loss. Defaults to 20.
        required (bool): Check even when the model has no MACL head (no
            submodule with ``last_num_pairs`` and no ``head``): a
            dual-modality config whose model lost its MACL head is then
            reported. By default such a model turns the hook off, logged
            once, so the hook can sit in a shared runtime config. Defaults
            to False.
    """

    priority = 'NORMAL'

    def __init__(self,
                 loss_key: str = 'loss_macl',
                 policy: str = 'warn',
                 head: Optional[str] = None,
                 num_pairs: Optional[int] = None,
                 loss_weight: Optional[float] = None,
                 chance_warmup: int = 50,
                 chance_window: int = 20,
                 chance_threshold: float = 0.95,
                 control_interval: int = 0,
                 control_warmup: int = 50,
                 control_margin: float = 0.05,
                 constant_iters: int = 20,
                 required: bool = False) -> None:
        if policy not in _POLICIES:
            raise ValueError(f'MACLCheckHook.policy must be one of '
                             f'{_POLICIES}, got {policy!r}')
        self.loss_key = loss_key
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
        self.constant_iters = max(2, constant_iters)
        self.required = required
        self._sync = None
        self._active = True
        self._head = None
        self._head_params: List = []
        self._other_params: List = []
        self._versions: Optional[tuple] = None
        self._last_value: Optional[float] = None
        self._same_count = 0
        self._window_sum = 0.0
        self._window_count = 0
        self._gap_sum = 0.0
        self._gap_count = 0
        self._logged = set()
        self._streaks: Dict[str, int] = {}
        self.stats = dict(problems=0, chance_warnings=0, control_runs=0,
                          control_warnings=0)

    # ------------------------------------------------------------------ #
    def before_run(self, runner) -> None:
        self._sync = monitor_sync_of(runner)
        for name in _NAMES:
            self._sync.declare(_PREFIX + name)

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
                'Set MACLCheckHook required=True to demand '
                f'{self.loss_key} anyway, or remove the hook.',
                logging.WARNING)
            return
        self._active = True
        if self._head is None:
            self._log_once(
                'nohead', 'MACLCheckHook (required=True): the model has no '
                f'MACL head; {self.loss_key} is still demanded, so it will '
                'be reported missing. Add model.macl_head to the config.',
                logging.WARNING)
            return
        head_ids = {id(p) for p in self._head.parameters()}
        self._head_params = [p for p in self._head.parameters()
                             if p.requires_grad]
        self._other_params = [p for p in model.parameters()
                              if p.requires_grad and id(p) not in head_ids]

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
        return float(outputs[key])

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

    def _local_problems(self, value: Optional[float],
                        ratio: Optional[float]) -> List[str]:
        if value is None:
            self._last_value, self._same_count = None, 0
            return ['missing']
        if not math.isfinite(value):
            return ['nonfinite']
        problems = []
        if value == 0.0 and ratio is not None:
            problems.append('zero')
        if value == self._last_value:
            self._same_count += 1
        else:
            self._last_value, self._same_count = value, 1
        if self._same_count >= self.constant_iters and value != 0.0:
            problems.append('constant')
        return problems

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if not self._active:
            return
        iteration = runner.iter + 1
        outputs = outputs or {}
        sync = self._sync
        value = self._logged_value(runner, outputs, self.loss_key)
        ratio = None
        if value is not None and math.isfinite(value):
            ratio = self._chance_ratio(runner, outputs, value, data_batch)
        problems = self._local_problems(value, ratio)
        sync.post(_PREFIX + 'seen', 1.0)
        for name in _PROBLEMS:
            sync.post(_PREFIX + name, 1.0 if name in problems else 0.0)
        for name in problems:
            self._report_local(runner, name, iteration, data_batch)
        if ratio is not None and math.isfinite(ratio):
            sync.post(_PREFIX + 'ratio_sum', ratio)
            sync.post(_PREFIX + 'ratio_count', 1.0)
        gap = self._logged_value(runner, outputs, 'macl_pair_gap')
        if gap is not None and math.isfinite(gap):
            sync.post(_PREFIX + 'gap_sum', gap)
            sync.post(_PREFIX + 'gap_count', 1.0)
        # Every rank, every iteration: a collective only when due.
        if sync.sync(runner):
            self._check_reach(runner, iteration)
            self._evaluate(runner, sync, iteration, data_batch)

    def _report_local(self, runner, name: str, iteration: int,
                      data_batch) -> None:
        key = f'local_{name}'
        if key in self._logged:
            return
        write_event(runner.work_dir, 'macl_presence_local', iter=iteration,
                    problem=name, files=batch_file_names(data_batch))
        self._log_once(
            key, f'MACLCheckHook: rank {get_rank()} sees {self.loss_key} '
            f'{name} at iteration {iteration}; every rank decides at the '
            'next sync (the log interval under DDP).', logging.WARNING)

    def _check_reach(self, runner, iteration: int) -> None:
        """A loss detached from the head leaves the head's parameters as
        they were while the rest of the model trains."""
        if not self._head_params or not self._other_params:
            return
        versions = (_tensors_version(self._head_params),
                    _tensors_version(self._other_params))
        previous, self._versions = self._versions, versions
        if previous is None:
            return
        head_moved = versions[0] != previous[0]
        model_moved = versions[1] != previous[1]
        if model_moved and not head_moved:
            self._sync.post(_PREFIX + 'unreached', 1.0)
            self._report_local(runner, 'unreached', iteration, None)

    # ------------------------------------------------------------------ #
    def _evaluate(self, runner, sync, iteration: int, data_batch) -> None:
        last = lambda name: sync.last(_PREFIX + name)  # noqa: E731
        found = {name: int(last(name)) for name in _PROBLEMS if last(name)}
        # 'unreached' is posted after its sync: it is counted at the next.
        if found:
            self._problems(runner, iteration, found, int(last('seen')),
                           data_batch)
        count = last('ratio_count')
        if count > 0 and iteration > self.chance_warmup:
            # Sums over ranks and the iterations since the last sync.
            self._window_sum += last('ratio_sum')
            self._window_count += int(count)
            if self._window_count >= self.chance_window * get_world_size():
                self._check_chance(runner, iteration)
        if self.control_interval > 0 and last('gap_count') > 0:
            self._gap_sum += last('gap_sum')
            self._gap_count += int(last('gap_count'))
            if self._gap_count >= self.control_interval * get_world_size():
                self._check_control(runner, iteration)

    def _problems(self, runner, iteration: int, found: Dict[str, int],
                  seen: int, data_batch) -> None:
        self.stats['problems'] += 1
        update_counters('macl_check', **self.stats)
        world = get_world_size()
        text = '; '.join(
            f'{self.loss_key} ' +
            _DESCRIBE[name].format(n=self.constant_iters) +
            f' ({count} of {seen} rank-iterations)'
            for name, count in found.items())
        message = (f'MACLCheckHook at iteration {iteration} (rank '
                   f'{get_rank()}, world size {world}): {text}. The '
                   'cross-modal loss is not training: check that the model '
                   'has a macl_head, that it gets paired inputs on every '
                   'rank, and that no exception around it is swallowed.')
        write_event(runner.work_dir, 'macl_presence', iter=iteration,
                    problems=sorted(found), policy=self.policy,
                    files=batch_file_names(data_batch))
        if self.policy == 'raise':
            raise RuntimeError(f'[mmsafe] {message} Set MACLCheckHook '
                               "policy='warn' to only log this.")
        # A new kind of problem is logged at once, a lasting one at powers
        # of two.
        self._warn_streak('problems:' + ','.join(sorted(found)), message,
                          logging.ERROR)

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

    def _check_control(self, runner, iteration: int) -> None:
        gap = self._gap_sum / self._gap_count
        self._gap_sum, self._gap_count = 0.0, 0
        self.stats['control_runs'] += 1
        ok = iteration <= self.control_warmup or gap >= self.control_margin
        verdict = ('warm-up' if iteration <= self.control_warmup else
                   'pass' if ok else 'fail')
        update_counters('macl_check', control_gap=gap,
                        control_verdict=verdict, **self.stats)
        write_event(runner.work_dir, 'macl_control', iter=iteration, gap=gap,
                    verdict=verdict, margin=self.control_margin)
        if ok:
            self._streaks['control'] = 0
            if verdict == 'pass' and 'control_pass' not in self._logged:
                self._log_once(
                    'control_pass', f'MACLCheckHook: shuffled-pair control '
                    f'passes at iteration {iteration}: true pairs are '
                    f'{gap:+.3f} more similar (cosine) than mismatched pairs '
                    f'(margin {self.control_margin}); every verdict is in '
                    'mmsafe_events.jsonl.', logging.INFO)
            return
        self.stats['control_warnings'] += 1
        update_counters('macl_check', **self.stats)
        self._warn_streak(
            'control', f'MACLCheckHook: shuffled-pair control at iteration '
            f'{iteration}: true pairs are only {gap:+.3f} more similar '
            f'(cosine) than mismatched pairs (margin {self.control_margin}). '
            'The model cannot tell true visible/infrared pairs from shuffled '
            'ones.')

    def _warn_streak(self, kind: str, message: str,
                     level: int = logging.WARNING) -> None:
        """Log at the 1st, 2nd, 4th, 8th ... consecutive occurrence, so a
        long run at chance does not flood the log."""
        streak = self._streaks.get(kind, 0) + 1
        self._streaks[kind] = streak
        if streak & (streak - 1) == 0:
            suffix = '' if streak == 1 else (
                f' ({streak} checks in a row; logged at powers of two, all '
                'in mmsafe_events.jsonl)')
            log(message + suffix, level)

    def _log_once(self, key: str, message: str, level: int) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log(message, level)

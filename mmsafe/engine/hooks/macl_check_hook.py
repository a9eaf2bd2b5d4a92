"""Check the cross-modal MACL loss for the whole run: present, alive,
reaching its parameters, and better than chance."""
import math
from typing import Optional

from mmengine.hooks import Hook

from mmsafe.registry import HOOKS
from mmsafe.dist import get_world_size
from mmsafe.engine.macl_check.signals import (PROBLEMS, HeadReach,
                                              LossLiveness, WindowMean,
                                              chance_ratio, find_macl_head)
from mmsafe.engine.macl_check.verdicts import MACLVerdicts
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.engine.utils import unwrap_model
from mmsafe.errors import MMSafeValueError
from mmsafe.events import batch_file_names, log_once, update_scalar
from mmsafe.guard_outputs import (Counter, Event, Finding, GuardOutputs,
                                  Scalar, Section, Sync)

_POLICIES = ('warn', 'raise')
# Values every rank posts to the monitor sync (declared in before_run).
_NAMES = ('seen', ) + PROBLEMS + ('ratio_sum', 'ratio_count', 'gap_sum',
                                   'gap_count')


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

    guard_outputs = GuardOutputs(
        Section.MACL_CHECK,
        events=(Event.MACL_PRESENCE_LOCAL, Event.MACL_PRESENCE,
                Event.MACL_CHANCE, Event.MACL_CONTROL),
        counters=(Counter.MACL_CHECK, ),
        scalars=(Scalar.MACL_CHANCE_RATIO, ),
        findings=(Finding.MACL_PROBLEM, ),
        sync=(Sync.MACL_CHECK, ))

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
            raise MMSafeValueError(f'MACLCheckHook.policy must be one of '
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
        self._reach: Optional[HeadReach] = None
        self._liveness = LossLiveness(constant_iters)
        self._chance = WindowMean()
        self._gap = WindowMean()
        self._verdicts = MACLVerdicts(loss_key, policy, self.constant_iters,
                                      chance_threshold, control_warmup,
                                      control_margin)

    @property
    def stats(self) -> dict:
        """Counts of problem, chance and control verdicts."""
        return self._verdicts.stats

    def before_run(self, runner) -> None:
        self._sync = monitor_sync_of(runner)
        for name in _NAMES:
            self._sync.declare(Sync.MACL_CHECK.format(name))

    def before_train(self, runner) -> None:
        model = unwrap_model(runner.model)
        self._head = find_macl_head(model, self.head_path)
        # Decided from the model's structure, identical on every rank.
        self._active = self._head is not None or self.required
        if not self._active:
            log_once(
                'MACLCheckHook.inactive', 'MACLCheckHook: the model has no '
                'MACL head (no submodule with last_num_pairs), so the MACL '
                'checks are off. Set MACLCheckHook required=True to demand '
                f'{self.loss_key} anyway, or remove the hook.')
        elif self._head is None:
            log_once(
                'MACLCheckHook.nohead', 'MACLCheckHook (required=True): the '
                f'model has no MACL head; {self.loss_key} is still demanded, '
                'so it will be reported missing. Add model.macl_head to the '
                'config.')
        else:
            head_ids = {id(p) for p in self._head.parameters()}
            self._reach = HeadReach(
                [p for p in self._head.parameters() if p.requires_grad],
                [p for p in model.parameters()
                 if p.requires_grad and id(p) not in head_ids])

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
        num, weight = self.num_pairs, self.loss_weight
        if self._head is not None:
            num = num or getattr(self._head, 'last_num_pairs', None)
            if weight is None:
                weight = getattr(self._head, 'loss_weight', None)
        if not num and isinstance(data_batch, dict):
            num = len(data_batch.get('data_samples') or [])
        ratio = chance_ratio(value, num, weight)
        if ratio is not None:
            update_scalar(runner.message_hub, Scalar.MACL_CHANCE_RATIO,
                          ratio)
        return ratio

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
        problems = self._liveness.problems(value, ratio)
        sync.post(Sync.MACL_CHECK.format('seen'), 1.0)
        for name in PROBLEMS:
            sync.post(Sync.MACL_CHECK.format(name),
                      1.0 if name in problems else 0.0)
        for name in problems:
            self._verdicts.local(runner.work_dir, name, iteration,
                                 batch_file_names(data_batch))
        for key, found in (('ratio', ratio), ('gap', self._logged_value(
                runner, outputs, 'macl_pair_gap'))):
            if found is not None and math.isfinite(found):
                sync.post(Sync.MACL_CHECK.format(key + '_sum'), found)
                sync.post(Sync.MACL_CHECK.format(key + '_count'), 1.0)
        # Every rank, every iteration: a collective only when due.
        if sync.sync(runner):
            if self._reach is not None and self._reach.unreached():
                # Posted after its sync: counted at the next one.
                sync.post(Sync.MACL_CHECK.format('unreached'), 1.0)
                self._verdicts.local(runner.work_dir, 'unreached',
                                     iteration, [])
            self._evaluate(runner, sync, iteration, data_batch)

    def _evaluate(self, runner, sync, iteration: int, data_batch) -> None:
        def last(name: str) -> float:
            return sync.last(Sync.MACL_CHECK.format(name))

        found = {name: int(last(name)) for name in PROBLEMS if last(name)}
        if found:
            ranks = set()
            for name in found:
                named = sync.last_ranks(Sync.MACL_CHECK.format(name))
                ranks = None if named is None or ranks is None else \
                    ranks | set(named)
            self._verdicts.problems(runner.work_dir, iteration, found,
                                    int(last('seen')),
                                    batch_file_names(data_batch),
                                    None if ranks is None else sorted(ranks))
        world = get_world_size()
        if last('ratio_count') > 0 and iteration > self.chance_warmup:
            # Sums over ranks and the iterations since the last sync.
            self._chance.add(last('ratio_sum'), last('ratio_count'))
            taken = self._chance.take(self.chance_window * world)
            if taken is not None:
                self._verdicts.chance(runner.work_dir, iteration, taken[0],
                                      taken[1] // world)
        if self.control_interval > 0 and last('gap_count') > 0:
            self._gap.add(last('gap_sum'), last('gap_count'))
            taken = self._gap.take(self.control_interval * world)
            if taken is not None:
                self._verdicts.control(runner.work_dir, iteration, taken[0])

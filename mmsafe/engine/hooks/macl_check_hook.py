"""Check the run's pairing-sensitive loss terms (MACL, or a project's own
contrastive or alignment terms) for the whole run: present, alive,
reaching their head, and better than chance.

The signals are read from the logged loss values
(:mod:`mmsafe.engine.hooks.macl_signals`); :class:`MACLVerdicts` turns the
values every rank agreed on into what is logged, recorded in
``mmsafe_events.jsonl`` and counted under ``mmsafe/macl_check``, and stops
the run when the policy says so.
"""
import logging
import math
from typing import Dict, List, Optional, Sequence, Union

from mmengine.hooks import Hook

from mmsafe.registry import HOOKS
from mmsafe.dist import get_rank, get_world_size
from mmsafe.engine.guard_status import ACTIVE, INACTIVE, PARTIAL
from mmsafe.engine.hooks.macl_signals import (TERM_PROBLEMS, HeadReach,
                                              LossLiveness, WindowMean,
                                              chance_ratio, describe,
                                              find_macl_head)
from mmsafe.engine.modalities import modalities_of
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.engine.utils import unwrap_model
from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError
from mmsafe.events import (batch_file_names, log, log_once, update_counters,
                           update_scalar, write_event)
from mmsafe.guard_outputs import (CounterKey, Event, GuardOutputs, Scalar,
                                  Section)
from mmsafe.modalities import (RECOGNISED_LOSSES, find_loss_key, flatten)

_POLICIES = ('warn', 'raise')
#: the monitor-sync name of one value this hook posts
SYNC = 'macl_check/{}'
# Values every rank posts to the monitor sync (declared in before_run), and
# per watched term: 'present/<term>' and '<problem>/<term>'.
_NAMES = ('seen', 'unreached', 'ratio_sum', 'ratio_count', 'gap_sum',
          'gap_count')
#: most loss terms one hook watches (each takes 5 monitor-sync names)
MAX_TERMS = 8


class StreakLog:
    """Log a lasting finding at its 1st, 2nd, 4th, 8th ... consecutive
    occurrence, so a long run of it does not flood the log."""

    def __init__(self) -> None:
        self._streaks: Dict[str, int] = {}

    def reset(self, kind: str) -> None:
        self._streaks[kind] = 0

    def log(self, kind: str, message: str, level: int) -> None:
        streak = self._streaks.get(kind, 0) + 1
        self._streaks[kind] = streak
        if streak & (streak - 1) == 0:
            suffix = '' if streak == 1 else (
                f' ({streak} checks in a row; logged at powers of two, all '
                'in mmsafe_events.jsonl)')
            log(message + suffix, level)


class MACLVerdicts:
    """Report the MACL check's findings. Every rank calls the same method
    with the same (all-reduced) values at the same iteration, so every rank
    logs, records and raises alike.

    Args:
        loss_key (str): The term a verdict without one is about (the
            InfoNCE term of the chance check).
        policy (str): ``'warn'`` or ``'raise'`` for problems of the loss.
        constant_iters (int): Length of a constant streak (for messages).
        chance_threshold (float): Chance-ratio mean at or above which the
            loss counts as chance.
        control_warmup (int): Iterations before a control can fail.
        control_margin (float): Required shuffled-pair gap.
    """

    def __init__(self, loss_key: str, policy: str, constant_iters: int,
                 chance_threshold: float, control_warmup: int,
                 control_margin: float) -> None:
        self.loss_key = loss_key
        self.policy = policy
        self.constant_iters = constant_iters
        self.chance_threshold = chance_threshold
        self.control_warmup = control_warmup
        self.control_margin = control_margin
        self._streaks = StreakLog()
        self.stats = dict(problems=0, chance_warnings=0, control_runs=0,
                          control_warnings=0)
        self._reported = set()

    def local(self, work_dir: Optional[str], name: str, iteration: int,
              files: list, term: Optional[str] = None) -> None:
        """This rank's first problem of kind ``name`` on ``term`` (default
        ``loss_key``): logged at once and recorded
        (``macl_presence_local``); later ones of that kind and term wait
        for the common verdict."""
        term = term or self.loss_key
        if (term, name) in self._reported:
            return
        self._reported.add((term, name))
        message = (f'MACLCheckHook: rank {get_rank()} sees {term} '
                   f'{name} at iteration {iteration}; every rank decides at '
                   'the next sync (the log interval under DDP).')
        write_event(work_dir, Event.MACL_PRESENCE_LOCAL, message,
                    logging.WARNING, iter=iteration, problem=name, term=term,
                    files=files)

    def problems(self, work_dir: Optional[str], iteration: int,
                 found: Dict, seen: int, files: list,
                 ranks: Optional[list] = None) -> None:
        """Problems of the loss terms (``(term, kind)`` or kind ->
        rank-iterations) out of ``seen`` rank-iterations, on ``ranks``
        (None: not known): logged, or raised with ``policy='raise'``."""
        self.stats['problems'] += 1
        update_counters(CounterKey.MACL_CHECK, **self.stats)
        text = describe(self.loss_key, found, seen, self.constant_iters)
        world = get_world_size()
        where = ''
        if world > 1:
            on = (f'on rank(s) {", ".join(map(str, ranks))}'
                  if ranks else 'on some rank(s)')
            where = f' ({on} of {world}; reported by rank {get_rank()})'
        message = (f'MACLCheckHook at iteration {iteration}{where}: {text}. '
                   'The cross-modal loss is not training: check that the '
                   'model has its contrastive head, that it gets paired '
                   'inputs on every rank (a partner lookup that finds '
                   'nothing leaves it out), and that no exception around '
                   'it is swallowed.')
        kinds = sorted({k[1] if isinstance(k, tuple) else k for k in found})
        terms = sorted({k[0] if isinstance(k, tuple) else self.loss_key
                        for k in found})
        write_event(work_dir, Event.MACL_PRESENCE, iter=iteration,
                    problems=kinds, terms=terms, policy=self.policy,
                    files=files, ranks=ranks)
        if self.policy == 'raise':
            raise MMSafeRuntimeError(f'[mmsafe] {message} Set MACLCheckHook '
                                     "policy='warn' to only log this.")
        # A new kind of problem is logged at once, a lasting one at powers
        # of two.
        self._streaks.log('problems:' + ','.join(sorted(map(str, found))),
                          message, logging.ERROR)

    def chance(self, work_dir: Optional[str], iteration: int, mean: float,
               window: int) -> None:
        """The chance-ratio ``mean`` over the last ``window`` iterations."""
        update_counters(CounterKey.MACL_CHECK, chance_ratio=mean)
        if mean < self.chance_threshold:
            self._streaks.reset('chance')
            return
        self.stats['chance_warnings'] += 1
        update_counters(CounterKey.MACL_CHECK, **self.stats)
        write_event(work_dir, Event.MACL_CHANCE, iter=iteration,
                    ratio=mean, window=window,
                    threshold=self.chance_threshold)
        self._streaks.log(
            'chance', f'MACLCheckHook: {self.loss_key} is at chance level at '
            f'iteration {iteration}: mean loss / ln(B) = {mean:.3f} over the '
            f'last {window} iterations (threshold {self.chance_threshold}). '
            'The visible and infrared embeddings carry no pairing '
            'information: check that pairs are matched (same file stem) and '
            'that both modalities get identical geometric transforms.',
            logging.WARNING)

    def control(self, work_dir: Optional[str], iteration: int,
                gap: float) -> None:
        """The shuffled-pair ``gap`` averaged over the last interval."""
        self.stats['control_runs'] += 1
        ok = iteration <= self.control_warmup or gap >= self.control_margin
        verdict = ('warm-up' if iteration <= self.control_warmup else
                   'pass' if ok else 'fail')
        update_counters(CounterKey.MACL_CHECK, control_gap=gap,
                        control_verdict=verdict, **self.stats)
        write_event(work_dir, Event.MACL_CONTROL, iter=iteration, gap=gap,
                    verdict=verdict, margin=self.control_margin)
        if ok:
            self._streaks.reset('control')
            if verdict == 'pass':
                log_once(
                    'MACLCheckHook.control_pass', 'MACLCheckHook: '
                    f'shuffled-pair control passes at iteration {iteration}: '
                    f'true pairs are {gap:+.3f} more similar (cosine) than '
                    f'mismatched pairs (margin {self.control_margin}); every '
                    'verdict is in mmsafe_events.jsonl.', logging.INFO)
            return
        self.stats['control_warnings'] += 1
        update_counters(CounterKey.MACL_CHECK, **self.stats)
        self._streaks.log(
            'control', f'MACLCheckHook: shuffled-pair control at iteration '
            f'{iteration}: true pairs are only {gap:+.3f} more similar '
            f'(cosine) than mismatched pairs (margin {self.control_margin}). '
            'The model cannot tell true visible/infrared pairs from shuffled '
            'ones.', logging.WARNING)


@HOOKS.register_module()
class MACLCheckHook(Hook):
    """Watch the run's pairing-sensitive loss terms on every rank, for the
    whole run.

    Which terms: ``loss_key`` when given; else the run's declaration
    (``mmsafe_modalities = dict(losses=...)`` in the config, or a
    component's, such as mmsafe's ``MACLHead``: ``loss_macl``); both are
    demanded from the first iteration. With neither, the terms named
    :data:`~mmsafe.modalities.RECOGNISED_LOSSES` (``loss_macl``,
    ``loss_contrast``, ``loss_align``) are watched for, and one that any
    rank produced is demanded from then on, on every rank; when none
    appears, the hook says once that the checks are off for the run. A
    name matches a logged key equal to it or ending in ``.name`` (a RoI
    head's prefix such as ``roi.``; nested dicts are read with dotted
    keys).

    Everything is read from what MMEngine logged for the iteration (the
    loss dict's values, already on the host): no device read, no call into
    the model. Each rank posts what it saw to :class:`MonitorSync`; at the
    next sync (every iteration in a single process, the log interval under
    DDP) every rank sees the same sums and warns or raises together, naming
    the iteration, the term and the ranks; none hangs.

    1. Each term is alive, every iteration: in the loss dict, finite,
       non-zero (excused when the iteration had fewer than 2 candidates to
       contrast), not constant (the same value ``constant_iters``
       iterations in a row), and the MACL head's trainable parameters
       change while the rest of the model trains (checked at each sync
       from the tensors' version counters; a head is the submodule with a
       ``last_num_pairs`` attribute, or ``head``). A rank logs its own first
       problem of each kind and term at once (and in
       ``mmsafe_events.jsonl``, ``macl_presence_local``).
    2. Chance level, on the InfoNCE term (the declaration's ``chance``, else
       the first term named like ``*macl*``/``*contrast*``/``*nce*``): an
       InfoNCE over ``B`` candidates sits at ``ln(B)`` when the embeddings
       carry no pairing information. ``train/macl_chance_ratio`` =
       unweighted loss / ln(B) is logged every iteration (by the MACL head
       when it returns ``macl_chance_ratio``, as mmsafe's ``MACLHead`` does;
       else by this hook). The hook warns when its mean over ranks and
       ``chance_window`` iterations after ``chance_warmup`` iterations is at
       or above ``chance_threshold``: pairing broken or modalities
       misaligned.
    3. Shuffled-pair control (``control_interval`` > 0): the head's
       ``macl_pair_gap`` (mean cosine similarity of the true pairs minus
       that of mismatched pairs) is averaged over ranks and
       ``control_interval`` iterations; after ``control_warmup`` iterations
       the verdict fails when the gap is below ``control_margin``. Every
       verdict is logged, in ``mmsafe_events.jsonl`` (``macl_control``) and
       in ``safety_report.json`` (``mmsafe/macl_check``).

    For a head that does not return ``macl_chance_ratio``, ``B`` is
    ``num_pairs``, else the declaration's ``num_pairs``, else the head's
    ``last_num_pairs``, else the batch size; the loss is divided by
    ``loss_weight``, else the weight the declaration gives the term, else
    the head's ``loss_weight``, else 1 (then said at start-up: a weight
    already applied moves the ratio).

    Args:
        loss_key (str | Sequence[str], optional): The term(s) to demand.
            Default: the run's declaration, else recognition (above).
        policy (str): ``'warn'`` (default) or ``'raise'`` for a term that
            is missing, not finite, zero, constant or unreached.
        head (str, optional): Attribute path of the MACL head in the
            unwrapped model (e.g. ``'macl_head'``). Default: the first
            submodule with a ``last_num_pairs`` attribute.
        num_pairs (int, optional): ``B`` when the head does not tell.
        loss_weight (float, optional): Weight already applied to the
            InfoNCE term.
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
        required (bool): Demand ``loss_key`` (default ``'loss_macl'``) even
            when nothing declares a term: a dual-modality config whose
            model lost its MACL head is then reported. Defaults to False.

    Raises:
        MMSafeValueError: a policy that is not one of ``'warn'`` and
            ``'raise'``, or more than :data:`MAX_TERMS` terms.
    """

    guard_outputs = GuardOutputs(
        Section.MACL_CHECK,
        events=(Event.MACL_PRESENCE_LOCAL, Event.MACL_PRESENCE,
                Event.MACL_CHANCE, Event.MACL_CONTROL),
        counters=(CounterKey.MACL_CHECK, ),
        scalars=(Scalar.MACL_CHANCE_RATIO, ))

    priority = 'NORMAL'

    def __init__(self,
                 loss_key: Union[str, Sequence[str], None] = None,
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
        self.loss_key = [loss_key] if isinstance(loss_key, str) else (
            list(loss_key) if loss_key is not None else None)
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
        self._head = None
        self._reach: Optional[HeadReach] = None
        # the terms: watched (all), demanded from the start, adopted once
        # a rank produced them (every rank alike, from the synced sums),
        # seen by this rank
        self.terms: List[str] = []
        self.source = ''
        self._demanded: set = set()
        self._adopted: set = set()
        self._seen_here: set = set()
        self._modalities = None
        self._weights: Dict[str, Optional[float]] = {}
        self._declared_pairs: Optional[int] = None
        self._liveness: Dict[str, LossLiveness] = {}
        self._synced = False
        self._chance = WindowMean()
        self._gap = WindowMean()
        self._verdicts = MACLVerdicts(
            (self.loss_key or ['loss_macl'])[0], policy, self.constant_iters,
            chance_threshold, control_warmup, control_margin)

    @property
    def stats(self) -> dict:
        """Counts of problem, chance and control verdicts."""
        return self._verdicts.stats

    @property
    def active_terms(self) -> List[str]:
        """The terms judged now (demanded, or adopted)."""
        return [t for t in self.terms
                if t in self._demanded or t in self._adopted]

    def _choose_terms(self, runner) -> None:
        """Which terms, from where, with which weights (the same on every
        rank: from the config and the model's structure)."""
        modalities = modalities_of(runner)
        declared = modalities.losses
        if self.loss_key:
            self.terms, self.source = list(self.loss_key), \
                'MACLCheckHook loss_key'
            self._demanded = set(self.terms)
        elif declared:
            self.terms = list(declared)
            self.source = modalities.sources.get('losses', 'declared')
            self._demanded = set(self.terms)
        elif self.required:
            self.terms, self.source = ['loss_macl'], \
                'MACLCheckHook required=True'
            self._demanded = set(self.terms)
        else:
            self.terms, self.source = list(RECOGNISED_LOSSES), 'recognised'
        if len(self.terms) > MAX_TERMS:
            raise MMSafeValueError(
                f'[mmsafe] MACLCheckHook watches at most {MAX_TERMS} loss '
                f'terms; got {len(self.terms)} ({self.terms} from '
                f'{self.source})')
        self._weights = dict(declared or {})
        self._declared_pairs = modalities.num_pairs
        self._modalities = modalities
        self._liveness = {t: LossLiveness(self.constant_iters)
                          for t in self.terms}
        self._verdicts.loss_key = self._chance_term or self.terms[0]

    @property
    def _chance_term(self) -> Optional[str]:
        """The InfoNCE term whose chance level is judged: the declared
        one, else the first InfoNCE-named term among those judged (or seen
        here) so far."""
        if self._modalities is None:
            return None
        judged = [t for t in self.terms if t in self._demanded
                  or t in self._adopted or t in self._seen_here]
        return self._modalities.chance_term(judged)

    def before_run(self, runner) -> None:
        self._sync = monitor_sync_of(runner)
        self._choose_terms(runner)
        for name in _NAMES:
            self._sync.declare(SYNC.format(name))
        for term in self.terms:
            for name in ('present', ) + TERM_PROBLEMS:
                self._sync.declare(SYNC.format(f'{name}/{term}'))

    def before_train(self, runner) -> None:
        model = unwrap_model(runner.model)
        self._head = find_macl_head(model, self.head_path)
        if self._head is not None:
            head_ids = {id(p) for p in self._head.parameters()}
            self._reach = HeadReach(
                [p for p in self._head.parameters() if p.requires_grad],
                [p for p in model.parameters()
                 if p.requires_grad and id(p) not in head_ids])
        if self._demanded:
            log(f'MACLCheckHook: demanding {", ".join(self.terms)} '
                f'({self.source}) on every rank, every iteration; '
                + self._chance_words(), logging.INFO)

    def _chance_words(self) -> str:
        term = self._chance_term
        if term is None:
            return ('no InfoNCE term among them: the chance level is not '
                    'judged (declare mmsafe_modalities chance=<term>)')
        weight, where = self._weight_of(term)
        return (f'chance level judged on {term} with weight {weight:g} '
                f'({where})' + ('; a weight already applied to it moves '
                                'the ratio: declare mmsafe_modalities '
                                f'losses=dict({term}=<weight>)'
                                if where == 'assumed' else ''))

    def _weight_of(self, term: str) -> tuple:
        """``(weight, where from)`` of ``term``."""
        if self.loss_weight is not None:
            return float(self.loss_weight), 'MACLCheckHook loss_weight'
        if self._weights.get(term) is not None:
            return float(self._weights[term]), 'declared'
        head_weight = getattr(self._head, 'loss_weight', None)
        if isinstance(head_weight, (int, float)):
            return float(head_weight), 'the head\'s loss_weight'
        return 1.0, 'assumed'

    @staticmethod
    def _logged_value(runner, flat: dict, key: Optional[str]
                      ) -> Optional[float]:
        """This iteration's value of ``flat[key]`` as MMEngine logged it
        (``RuntimeInfoHook`` already read it from the device), or None."""
        if key is None or key not in flat:
            return None
        buffer = runner.message_hub.log_scalars.get(f'train/{key}')
        if buffer is not None:
            return float(buffer.current())
        return float(flat[key])

    def _pairs_of(self, data_batch) -> Optional[int]:
        num = self.num_pairs or self._declared_pairs
        if not num and self._head is not None:
            num = getattr(self._head, 'last_num_pairs', None)
        if not num and isinstance(data_batch, dict):
            num = len(data_batch.get('data_samples') or [])
        return num

    def _chance_ratio(self, runner, flat: dict, value: float,
                      data_batch) -> Optional[float]:
        logged = self._logged_value(runner, flat, find_loss_key(
            'macl_chance_ratio', list(flat)))
        if logged is not None:
            return logged
        ratio = chance_ratio(value, self._pairs_of(data_batch),
                             self._weight_of(self._chance_term)[0])
        if ratio is not None:
            update_scalar(runner.message_hub, Scalar.MACL_CHANCE_RATIO,
                          ratio)
        return ratio

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        iteration = runner.iter + 1
        flat = flatten(outputs or {})
        keys = list(flat)
        sync = self._sync
        files = None
        ratio = None
        possible = (self._pairs_of(data_batch) or 0) >= 2
        found_keys = {}
        for term in self.terms:
            key = found_keys[term] = find_loss_key(term, keys)
            sync.post(SYNC.format(f'present/{term}'),
                      1.0 if key is not None else 0.0)
            if key is not None:
                self._seen_here.add(term)
        chance = self._chance_term
        for term in self.terms:
            key = found_keys[term]
            if not (term in self._demanded or term in self._adopted
                    or term in self._seen_here):
                continue
            value = self._logged_value(runner, flat, key)
            term_ratio = None
            if term == chance and value is not None and \
                    math.isfinite(value):
                term_ratio = ratio = self._chance_ratio(runner, flat, value,
                                                        data_batch)
            problems = self._liveness[term].problems(
                value, term_ratio, contrast_possible=None
                if term == chance else possible)
            for name in problems:
                sync.post(SYNC.format(f'{name}/{term}'), 1.0)
                if files is None:
                    files = batch_file_names(data_batch)
                self._verdicts.local(runner.work_dir, name, iteration, files,
                                     term=key or term)
        sync.post(SYNC.format('seen'), 1.0)
        for key, found in (('ratio', ratio), ('gap', self._logged_value(
                runner, flat, find_loss_key('macl_pair_gap', keys)))):
            if found is not None and math.isfinite(found):
                sync.post(SYNC.format(key + '_sum'), found)
                sync.post(SYNC.format(key + '_count'), 1.0)
        # Every rank, every iteration: a collective only when due.
        if sync.sync(runner):
            if self._reach is not None and self._reach.unreached():
                # Posted after its sync: counted at the next one.
                sync.post(SYNC.format('unreached'), 1.0)
                self._verdicts.local(runner.work_dir, 'unreached',
                                     iteration, [],
                                     term=self._chance_term or
                                     self.terms[0])
            self._evaluate(runner, sync, iteration, data_batch)

    def _evaluate(self, runner, sync, iteration: int, data_batch) -> None:
        def last(name: str) -> float:
            return sync.last(SYNC.format(name))

        for term in self.terms:
            if term not in self._demanded and last(f'present/{term}') > 0:
                self._adopted.add(term)
        if not self._synced:
            self._synced = True
            self._first_sync()
        found: Dict[tuple, int] = {}
        ranks: Optional[set] = set()
        for term in self.active_terms:
            for name in TERM_PROBLEMS:
                count = int(last(f'{name}/{term}'))
                if count:
                    found[(term, name)] = count
                    named = sync.last_ranks(
                        SYNC.format(f'{name}/{term}'))
                    ranks = None if named is None or ranks is None else \
                        ranks | set(named)
        if last('unreached'):
            found[(self._chance_term or self.terms[0], 'unreached')] = \
                int(last('unreached'))
            named = sync.last_ranks(SYNC.format('unreached'))
            ranks = None if named is None or ranks is None else \
                ranks | set(named)
        if found:
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

    def _first_sync(self) -> None:
        """Say once what is judged, now that every rank's first loss dicts
        were seen."""
        if self._demanded:
            return
        if not self._adopted:
            log('MACLCheckHook: no pairing-sensitive loss term in the loss '
                f'dict (looked for {", ".join(self.terms)}, also as the '
                'last part of a prefixed key such as roi.loss_contrast), so '
                'the MACL checks are off for this run until one appears. '
                'Declare your term in the config: mmsafe_modalities = '
                'dict(losses=dict(<key>=<weight already applied>)), or set '
                'MACLCheckHook required=True, or remove the hook.',
                logging.WARNING)
            return
        log(f'MACLCheckHook: recognised {", ".join(self.active_terms)} in '
            'the loss dict; demanded from now on, on every rank; '
            + self._chance_words(), logging.INFO)

    def guard_status(self, runner) -> dict:
        """Which terms were judged in this run, and how (see
        :mod:`mmsafe.engine.guard_status`)."""
        terms = self.active_terms
        if not terms:
            return dict(status=INACTIVE, detail='no pairing-sensitive loss '
                        f'term appeared (looked for {", ".join(self.terms)}'
                        '); declare mmsafe_modalities = dict(losses=dict('
                        '<key>=<weight>))')
        source = self.source if self._demanded else 'recognised'
        detail = (f'{", ".join(terms)} ({source}): '
                  'missing, non-finite, zero, constant' +
                  (', unreached' if self._reach is not None else '') +
                  '; ' + self._chance_words())
        partial = self._chance_term is None or \
            self._weight_of(self._chance_term)[1] == 'assumed'
        return dict(status=PARTIAL if partial else ACTIVE, detail=detail)

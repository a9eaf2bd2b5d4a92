"""Verdicts of the MACL check on values agreed by every rank: what is
logged, recorded in ``mmsafe_events.jsonl`` and counted under
``mmsafe/macl_check``, and when the run is stopped."""
import logging
from typing import Dict, Optional

from mmsafe.dist import get_rank, get_world_size
from mmsafe.errors import MMSafeRuntimeError
from mmsafe.guard_outputs import CounterKey, Event
from mmsafe.events import log, log_once, update_counters, write_event
from .signals import describe


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

"""Expected bands for logged scalars (:class:`Band`): warn, or stop the run
cleanly (:class:`ScalarBandsHook`)."""
import fnmatch
import logging
import math
import os.path as osp
from typing import Dict, List, Optional, Sequence

from mmengine.hooks import Hook

from mmsafe.registry import HOOKS

from mmsafe.dist import all_gather_object, get_rank
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.engine.runner.stop import stop_run
from mmsafe.engine.utils import train_progress
from mmsafe.errors import MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import log, update_counters, write_event

#: the monitor-sync name of the stop requests
STOP_VOTE = 'scalar_bands/stop'

ACTIONS = ('warn', 'stop')
_STAGE_PREFIXES = ('train/', 'val/', 'test/')


class Band:
    """One expected band: which scalars, which range, what to do.

    Args:
        key (str): Scalar name or ``fnmatch`` pattern, matched against the
            message hub name with and without its stage prefix
            (``'grad_norm'`` matches ``'train/grad_norm'``;
            ``'pascal_voc/mAP'`` matches ``'val/pascal_voc/mAP'``;
            ``'loss*'`` matches every loss).
        min (float, optional): Lowest allowed value.
        max (float, optional): Highest allowed value.
        finite (bool): The value must be finite. A non-finite value also
            violates any ``min``/``max``. Defaults to False.
        after_iter (int): Active from training iteration ``after_iter + 1``
            (1-based, as in the log). Defaults to 0.
        after_epoch (int): Active once ``after_epoch`` epochs are complete.
            Defaults to 0.
        action (str): ``'warn'`` or ``'stop'``. Defaults to ``'warn'``.
        patience (int): Consecutive violating values before acting.
            Defaults to 1.
    """

    def __init__(self,
                 key: str,
                 min: Optional[float] = None,  # noqa: A002 (config name)
                 max: Optional[float] = None,  # noqa: A002
                 finite: bool = False,
                 after_iter: int = 0,
                 after_epoch: int = 0,
                 action: str = 'warn',
                 patience: int = 1) -> None:
        if action not in ACTIONS:
            raise MMSafeValueError(f'band {key!r}: action must be one of '
                                   f'{ACTIONS}, got {action!r}')
        if min is None and max is None and not finite:
            raise MMSafeValueError(
                f'band {key!r} sets none of min, max, finite')
        if patience < 1:
            raise MMSafeValueError(f'band {key!r}: patience must be >= 1')
        self.key = key
        self.min = min
        self.max = max
        self.finite = finite
        self.after_iter = after_iter
        self.after_epoch = after_epoch
        self.action = action
        self.patience = patience

    def matches(self, name: str) -> bool:
        short = name
        for prefix in _STAGE_PREFIXES:
            if name.startswith(prefix):
                short = name[len(prefix):]
                break
        return (fnmatch.fnmatchcase(name, self.key)
                or fnmatch.fnmatchcase(short, self.key))

    def active(self, iteration: int, epoch: int) -> bool:
        """``iteration``: 1-based count of finished iterations; ``epoch``:
        finished epochs."""
        return iteration > self.after_iter and epoch >= self.after_epoch

    def violation(self, value: float) -> Optional[str]:
        """Why ``value`` is outside the band, or None."""
        if not math.isfinite(value):
            if self.finite or self.min is not None or self.max is not None:
                return 'is not finite'
            return None
        if self.min is not None and value < self.min:
            return f'is below min={self.min}'
        if self.max is not None and value > self.max:
            return f'is above max={self.max}'
        return None

    def describe(self) -> str:
        parts = []
        if self.min is not None:
            parts.append(f'min={self.min}')
        if self.max is not None:
            parts.append(f'max={self.max}')
        if self.finite:
            parts.append('finite')
        return f"{self.key} [{', '.join(parts)}]"


@HOOKS.register_module()
class ScalarBandsHook(Hook):
    """Watch logged scalars against expected bands from the config.

    Training scalars (``train/*`` in the message hub: every key of the loss
    dict, ``grad_norm``, ``lr`` and what other hooks publish, e.g.
    ``macl_chance_ratio``) are checked after every iteration in which they
    were updated; validation metrics after every validation. A band that
    is violated ``patience`` times in a row warns, or stops the run:

    * the reason is logged on every rank and written to the event log;
    * a checkpoint ``band_stop_iter_{N}.pth`` is saved in the work dir;
    * training ends at once, on every rank at the same iteration, through
      :func:`~mmsafe.engine.runner.stop.stop_run`: the loop's
      ``stop_training`` flag where the loop reads it before its next
      iteration (``IterBasedTrainLoop``; ``EpochBasedTrainLoop`` after a
      validation), else :class:`~mmsafe.engine.runner.StopTraining` with
      the reason and the checkpoint, which ``SafeRunner`` (``runner_type =
      'SafeRunner'``, set by ``configs/_base_/safety_runtime.py``) turns
      into a clean end (``after_train`` and ``after_run`` hooks run, exit
      code 0); under MMEngine's stock ``Runner`` the exception ends the
      run with its message and a non-zero exit code, on every rank.

    Under DDP, training losses differ between ranks: a stop request is
    posted to :class:`MonitorSync` and every rank stops at the
    same iteration, the next sync (the log interval; every iteration in a
    single process), once the summed request is non-zero. Validation
    metrics are decided with one small all-reduce per validation.

    Args:
        bands (Sequence[dict]): :class:`Band` configs, e.g.
            ``dict(key='grad_norm', max=20, action='warn', patience=3)``.
        save_checkpoint (bool): Save a checkpoint on stop. Defaults to True.
    """

    guard_outputs = GuardOutputs(
        Section.OTHER,
        events=(Event.BAND_VIOLATION, Event.BAND_STOP),
        counters=(CounterKey.SCALAR_BANDS, ))

    priority = 'NORMAL'

    def __init__(self, bands: Sequence[dict],
                 save_checkpoint: bool = True) -> None:
        self.bands: List[Band] = [Band(**dict(b)) for b in bands]
        if not self.bands:
            raise MMSafeValueError('ScalarBandsHook needs at least one band')
        self.save_checkpoint = save_checkpoint
        self._has_train_stop = any(b.action == 'stop' for b in self.bands)
        self._sync = None
        self._seen_len: Dict[str, int] = {}
        self._streaks: Dict[tuple, int] = {}
        self._stop_reason: Optional[str] = None
        self._stopped = False
        self._training = False
        self.num_violations = 0
        self.num_warnings = 0

    # ------------------------------------------------------------------ #
    def _check_values(self, runner, values: Dict[str, float], iteration: int,
                      epoch: int, stage: str) -> None:
        for index, band in enumerate(self.bands):
            if not band.active(iteration, epoch):
                continue
            for name, value in values.items():
                if not band.matches(name):
                    continue
                key = (index, name)
                why = band.violation(value)
                if why is None:
                    self._streaks[key] = 0
                    continue
                self.num_violations += 1
                streak = self._streaks.get(key, 0) + 1
                self._streaks[key] = streak
                if streak != band.patience:
                    continue
                reason = (f'{name}={value:.6g} {why} of band '
                          f'{band.describe()} for {streak} consecutive '
                          f'{stage} values (iteration {iteration}, '
                          f'epoch {epoch}, rank {get_rank()})')
                write_event(runner.work_dir, Event.BAND_VIOLATION, key=name,
                            value=value, band=band.describe(),
                            action=band.action, iter=iteration, epoch=epoch)
                if band.action == 'warn':
                    self.num_warnings += 1
                    log(f'ScalarBandsHook: {reason}.', logging.WARNING)
                else:
                    self._stop_reason = (reason if self._stop_reason is None
                                         else f'{self._stop_reason}; {reason}')
        update_counters(CounterKey.SCALAR_BANDS,
                        violations=self.num_violations,
                        warnings=self.num_warnings)

    def _updated_train_scalars(self, runner) -> Dict[str, float]:
        values = {}
        for name, buffer in runner.message_hub.log_scalars.items():
            if not name.startswith('train/'):
                continue
            length = len(buffer.data[0])
            if self._seen_len.get(name) == length:
                continue  # not updated since the last check
            self._seen_len[name] = length
            values[name] = float(buffer.current())
        return values

    # ------------------------------------------------------------------ #
    def before_run(self, runner) -> None:
        self._sync = monitor_sync_of(runner)
        if self._has_train_stop:
            # Declared on every rank (every rank builds the same hooks), so
            # the sync vector has the same names everywhere.
            self._sync.declare(STOP_VOTE)

    def before_train(self, runner) -> None:
        self._training = True

    def after_train(self, runner) -> None:
        self._training = False

    def after_train_iter(self, runner, batch_idx: int,
                         data_batch=None, outputs=None) -> None:
        if self._stopped:
            return
        values = self._updated_train_scalars(runner)
        self._check_values(runner, values, runner.iter + 1, runner.epoch,
                           'training')
        if not self._has_train_stop:
            return
        sync = self._sync
        sync.post(STOP_VOTE, 1.0 if self._stop_reason else 0.0)
        if sync.sync(runner) and sync.last(STOP_VOTE) > 0:
            self._stop(runner, in_train_iter=True)

    def after_val_epoch(self, runner,
                        metrics: Optional[Dict[str, float]] = None) -> None:
        if self._stopped:
            return
        values = {}
        for name, value in (metrics or {}).items():
            try:
                values[f'val/{name}'] = float(value)
            except (TypeError, ValueError):
                continue  # not a scalar (e.g. a per-class table)
        # 0 and 0 in a run that only evaluates (no training progress)
        epoch, it, _ = train_progress(runner)
        self._check_values(runner, values, it or 0, epoch or 0,
                           'validation')
        if not self._has_train_stop or not self._training:
            # A stop only means something inside a training run.
            return
        # Validation metrics are broadcast from rank 0, but a val loss is
        # not: decide together (one collective per validation, all ranks).
        votes = self._sync.sum_now(1.0 if self._stop_reason else 0.0)
        if votes > 0:
            self._stop(runner, in_train_iter=False)

    # ------------------------------------------------------------------ #
    def _stop(self, runner, in_train_iter: bool) -> None:
        self._stopped = True
        # Collective on every rank at the same point: each rank learns why.
        reasons = [r for r in all_gather_object(self._stop_reason) if r]
        reason = '; '.join(dict.fromkeys(reasons))
        iteration = runner.iter + 1 if in_train_iter else runner.iter
        filename = f'band_stop_iter_{iteration}.pth'
        log(f'ScalarBandsHook: stopping the run at iteration {iteration}: '
            f'{reason}. Saving {filename} and ending the train loop.',
            logging.WARNING)
        write_event(runner.work_dir, Event.BAND_STOP, reason=reason,
                    iter=iteration, epoch=runner.epoch,
                    checkpoint=filename if self.save_checkpoint else None)
        update_counters(CounterKey.SCALAR_BANDS, stopped=True,
                        stop_reason=reason)
        if self.save_checkpoint:
            # ``iter`` counts finished iterations. Inside an epoch the epoch
            # is not finished: a resume restarts it.
            runner.save_checkpoint(
                runner.work_dir, filename,
                meta=dict(epoch=runner.epoch, iter=iteration))
            log(f'ScalarBandsHook: saved '
                f'{osp.join(runner.work_dir, filename)}')
        stop_run(runner, reason, checkpoint=osp.join(
            runner.work_dir, filename) if self.save_checkpoint else None,
                 in_train_iter=in_train_iter)

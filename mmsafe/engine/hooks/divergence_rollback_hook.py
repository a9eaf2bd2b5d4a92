"""Roll a diverging run back to its last good state, past the data that
preceded the divergence."""
import copy
import logging
import math
import os.path as osp
import statistics
from collections import deque
from typing import Any, Dict, List, Optional

import torch
from mmengine.hooks import Hook

from mmsafe.registry import HOOKS
from mmsafe.checkpoint import atomic_write
from mmsafe.dist import all_gather_object, get_rank, is_distributed
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.engine.utils import unwrap_model
from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError
from mmsafe.events import (batch_file_names, log, update_counters,
                           write_event)
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.rng import RNGState

LOSS = 'divergence_rollback/loss'


def cpu_copy(value: Any) -> Any:
    """A deep copy of a state (dicts, lists, tuples, tensors, numbers) with
    every tensor copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to('cpu', copy=True)
    if isinstance(value, dict):
        return type(value)((k, cpu_copy(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(v) for v in value)
    return copy.deepcopy(value)


def _optimizer_stepped(runner) -> bool:
    """Whether this iteration ended a gradient-accumulation window."""
    should_update = getattr(runner.optim_wrapper, 'should_update', None)
    return True if should_update is None else bool(should_update())


def _schedulers(runner) -> List[Any]:
    """The runner's parameter schedulers, flattened (a list, or a dict of
    lists for several optimizers)."""
    found = getattr(runner, 'param_schedulers', None) or []
    if isinstance(found, dict):
        return [s for group in found.values() for s in group]
    return list(found)


@HOOKS.register_module()
class DivergenceRollbackHook(Hook):
    """When a run keeps going wrong, restore its last good state and go on
    past the data that preceded the trouble; at most ``max_rollbacks``
    times, then stop with an error that says what was tried.

    **When** (either rule, the same verdict on every rank without a
    collective of its own):

    * **skips keep coming**: more than ``max_skips`` optimizer steps were
      skipped because their gradient was not finite or spiked (the
      NaN-skip wrappers' ``unstable_skips``; fp16 overflows do not count)
      within the last ``skip_window`` iterations. Every rank skips the same
      steps, so every rank counts alike;
    * **the loss stays high** (``loss_ratio`` not None): the mean training
      loss, over every rank, stays above ``loss_ratio`` times its rolling
      median for ``loss_patience`` iterations. The median is over the
      losses of the last ``loss_window`` iterations that were not high
      (none is judged before that window is full). Each rank posts its
      loss to the run's monitoring sync, so under DDP the mean travels in
      the one all-reduce per log interval that mmsafe's hooks share, and
      the rule judges per log interval (a single process: per iteration).
      The loss is read from MMEngine's message hub, where it is already a
      Python number: no device read.

    **What** (every rank alike, at the end of the same iteration):

    * the last good snapshot is restored: the model's weights and buffers,
      the optimizer (with the AMP loss scaler and the spike-skip window;
      the skip counters keep counting), the parameter schedulers and the
      random generators (Python, NumPy, torch). Snapshots are CPU copies
      taken before the first iteration and every ``snapshot_interval``
      iterations; one is *good* once the ``snapshot_interval`` iterations
      after it went by without an unstable skip or a high loss;
    * the iteration count goes back to the snapshot's, so the schedule and
      the number of updates stay those of the plan (as PaLM restarts from a
      checkpoint before a spike); the loader is *not* rewound: the batches
      since the snapshot (the data window that preceded the divergence)
      are not trained again in this pass. Their file names go to the log,
      the ``rollback`` event and ``{work_dir}/rollback_{n}_files.txt``
      (``tools/check_dataset.py CONFIG --files`` checks them). In an
      epoch-based loop the epoch count goes on, so the run ends with the
      rolled-back iterations fewer;
    * it is logged loudly (rank 0's console, the safety report's
      ``rollbacks`` section, ``train``'s event log).

    Not rolled back: other hooks' own state (an EMA copy of the model),
    MMEngine's logged history, checkpoints written meanwhile.

    With gradient accumulation, snapshots and rollbacks wait for the end of
    the accumulation window (nothing is half-accumulated there), and the
    wrapper's accumulation count follows the iteration count back.

    After ``max_rollbacks`` rollbacks a further trigger stops the run with
    an error naming every rollback, its cause and the files moved past.

    Needs mmsafe's train loops (``runner_type = 'SafeRunner'``, set by
    ``configs/_base_/safety_runtime.py``), whose iteration count can be set
    back. The skip rule needs a NaN-skip optim wrapper; the snapshots hold
    weights and optimizer state on the CPU (twice the model's and the
    optimizer's size) and each costs one copy from the device.

    Args:
        snapshot_interval (int): iterations between snapshots. Defaults to
            100.
        skip_window (int): iterations of the skip rule's window. Defaults
            to 50.
        max_skips (int): unstable skips allowed in the window; one more
            rolls back. Must stay below the wrapper's
            ``max_consecutive_skips``, which stops the run first otherwise.
            Defaults to 5.
        loss_ratio (float, optional): the loss rule's factor over the
            rolling median (LLM Foundry's ``KillLossSpike`` stops a run at
            twice its rolling mean). None turns the rule off. Defaults to
            2.
        loss_window (int): iterations of the loss rule's rolling median
            (LLM Foundry: 100). Defaults to 100.
        loss_patience (int): iterations the loss must stay high (LLM
            Foundry: 5 in a row). Defaults to 5.
        max_rollbacks (int): rollbacks per run. Defaults to 3.

    Raises:
        ValueError: a setting out of range.
    """

    guard_outputs = GuardOutputs(
        Section.ROLLBACKS,
        events=(Event.ROLLBACK, ),
        counters=(CounterKey.ROLLBACK, ))

    # After every other hook of the iteration (the parameter schedulers
    # have stepped, checkpoints are written): a snapshot and a restore see
    # the state at the end of an iteration.
    priority = 'LOWEST'

    def __init__(self,
                 snapshot_interval: int = 100,
                 skip_window: int = 50,
                 max_skips: int = 5,
                 loss_ratio: Optional[float] = 2.0,
                 loss_window: int = 100,
                 loss_patience: int = 5,
                 max_rollbacks: int = 3) -> None:
        for name, value in (('snapshot_interval', snapshot_interval),
                            ('skip_window', skip_window),
                            ('loss_window', loss_window),
                            ('loss_patience', loss_patience)):
            if int(value) < 1:
                raise MMSafeValueError(f'DivergenceRollbackHook: {name} '
                                       f'must be >= 1, got {value}')
        if int(max_skips) < 0 or int(max_rollbacks) < 0:
            raise MMSafeValueError(
                'DivergenceRollbackHook: max_skips and max_rollbacks must '
                f'be >= 0, got {max_skips}, {max_rollbacks}')
        if loss_ratio is not None and not float(loss_ratio) > 1:
            raise MMSafeValueError('DivergenceRollbackHook: loss_ratio must '
                                   f'be > 1 or None, got {loss_ratio}')
        self.snapshot_interval = int(snapshot_interval)
        self.skip_window = int(skip_window)
        self.max_skips = int(max_skips)
        self.loss_ratio = None if loss_ratio is None else float(loss_ratio)
        self.loss_window = int(loss_window)
        self.loss_patience = int(loss_patience)
        self.max_rollbacks = int(max_rollbacks)
        self.rollbacks: List[Dict[str, Any]] = []
        self._good: Optional[Dict[str, Any]] = None
        self._pending: Optional[Dict[str, Any]] = None
        self._troubled = False  # since the pending snapshot
        self._executed = 0  # iterations run, rolled-back ones included
        self._skips_seen = 0
        self._skip_steps: deque = deque()  # executed index of each skip
        self._files: deque = deque()  # (runner.iter, files) since the good
        self._losses: deque = deque()  # (mean loss, iterations), healthy
        self._high_iters = 0
        self._block_iters = 0
        self._due_cause: Optional[str] = None
        self._snapshot_due = False
        self._sync = None

    # ------------------------------------------------------------ setup --
    def before_train(self, runner) -> None:
        loop = runner.train_loop
        if not getattr(loop, 'rewindable', False):
            raise MMSafeRuntimeError(
                '[mmsafe] DivergenceRollbackHook sets the iteration count '
                f'back after a rollback; the train loop {type(loop).__name__}'
                " cannot. Use runner_type = 'SafeRunner' (set by "
                'configs/_base_/safety_runtime.py), whose train loops can, '
                'or remove the hook.')
        wrapper = runner.optim_wrapper
        limit = getattr(wrapper, 'max_consecutive_skips', 0)
        if not hasattr(wrapper, 'unstable_skips'):
            log('DivergenceRollbackHook: the optim wrapper '
                f'{type(wrapper).__name__} does not skip steps, so only the '
                'loss rule can roll back; use NaNSkipOptimWrapper (or '
                'AmpNaNSkipOptimWrapper) for the skip rule.', logging.WARNING)
        elif limit and self.max_skips + 1 >= limit:
            raise MMSafeValueError(
                f'[mmsafe] DivergenceRollbackHook(max_skips={self.max_skips})'
                ' rolls back at the next skip, but the optim wrapper stops '
                f'the run after {limit} skips in a row '
                '(max_consecutive_skips) before that: set max_skips below '
                f'{limit} or raise optim_wrapper.max_consecutive_skips.')
        self._skips_seen = int(getattr(wrapper, 'unstable_skips', 0))
        self._sync = monitor_sync_of(runner)
        self._sync.declare(LOSS)
        self._good = self._snapshot(runner)
        self._pending = None
        self._files.clear()
        log(f'DivergenceRollbackHook: rolls back (at most '
            f'{self.max_rollbacks} times) when more than {self.max_skips} '
            f'steps are skipped within {self.skip_window} iterations' +
            ('' if self.loss_ratio is None else
             f', or when the loss stays above {self.loss_ratio:g}x its '
             f'rolling median for {self.loss_patience} iterations') +
            f'; a snapshot every {self.snapshot_interval} iterations.')

    # ------------------------------------------------------- iteration --
    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        self._executed += 1
        self._files.append((runner.iter, batch_file_names(
            data_batch or {}, limit=10**6)))
        cause = self._skip_rule(runner)
        loss_cause = self._loss_rule(runner)
        cause = self._due_cause or cause or loss_cause
        # snapshots and rollbacks only where an optimizer step ended (with
        # gradient accumulation, nothing is half-accumulated there)
        stepped = _optimizer_stepped(runner)
        if cause is not None:
            if not stepped:
                self._due_cause = cause
                return
            self._due_cause = None
            self._roll_back(runner, cause)
            return
        done = runner.iter + 1
        if done % self.snapshot_interval == 0:
            self._snapshot_due = True
        if self._snapshot_due and stepped:
            self._snapshot_due = False
            if self._pending is not None and not self._troubled:
                self._good = self._pending
                self._files = deque(f for f in self._files
                                    if f[0] >= self._good['iter'])
            self._pending = self._snapshot(runner)
            self._troubled = False

    def _skip_rule(self, runner) -> Optional[str]:
        skips = int(getattr(runner.optim_wrapper, 'unstable_skips', 0))
        for _ in range(skips - self._skips_seen):
            self._skip_steps.append(self._executed)
            self._troubled = True
        self._skips_seen = skips
        while self._skip_steps and \
                self._skip_steps[0] <= self._executed - self.skip_window:
            self._skip_steps.popleft()
        if len(self._skip_steps) > self.max_skips:
            return (f'{len(self._skip_steps)} optimizer steps skipped for a '
                    'non-finite or spiking gradient within the last '
                    f'{self.skip_window} iterations (max_skips='
                    f'{self.max_skips})')
        return None

    def _loss_rule(self, runner) -> Optional[str]:
        if self.loss_ratio is None:
            return None
        # the loss as MMEngine's RuntimeInfoHook logged it (a number)
        loss = runner.message_hub.get_scalar('train/loss').current() \
            if 'train/loss' in runner.message_hub.log_scalars else None
        if loss is not None and math.isfinite(loss):
            self._sync.post(LOSS, loss)
        self._block_iters += 1
        if not self._sync.sync(runner):
            return None
        count = self._sync.last_count(LOSS)
        iters, self._block_iters = self._block_iters, 0
        if not count:
            return None
        mean = self._sync.last(LOSS) / count
        window = sum(n for _, n in self._losses)
        if window >= self.loss_window:
            median = statistics.median(v for v, _ in self._losses)
            if mean > self.loss_ratio * median:
                self._high_iters += iters
                self._troubled = True
                if self._high_iters >= self.loss_patience:
                    return (f'the training loss stayed above '
                            f'{self.loss_ratio:g}x its rolling median '
                            f'{median:.4g} for {self._high_iters} '
                            f'iterations (latest mean {mean:.4g})')
                return None
        self._high_iters = 0
        self._losses.append((mean, iters))
        while sum(n for _, n in self._losses) - self._losses[0][1] >= \
                self.loss_window:
            self._losses.popleft()
        return None

    # -------------------------------------------------------- snapshot --
    def _snapshot(self, runner) -> Dict[str, Any]:
        """The state at the end of the current iteration (CPU copies)."""
        wrapper = runner.optim_wrapper
        return dict(
            iter=runner.iter + 1 if self._executed else runner.iter,
            model=cpu_copy(unwrap_model(runner.model).state_dict()),
            optim=cpu_copy(wrapper.state_dict()),
            schedulers=[cpu_copy(s.state_dict())
                        for s in _schedulers(runner)],
            rng=RNGState())

    def _restore(self, runner, snap: Dict[str, Any]) -> None:
        unwrap_model(runner.model).load_state_dict(snap['model'])
        wrapper = runner.optim_wrapper
        if hasattr(wrapper, 'rewind'):
            wrapper.rewind(copy.deepcopy(snap['optim']))
        else:
            wrapper.load_state_dict(copy.deepcopy(snap['optim']))
        wrapper.zero_grad()
        for scheduler, state in zip(_schedulers(runner), snap['schedulers']):
            scheduler.load_state_dict(copy.deepcopy(state))
        snap['rng'].restore()
        runner.train_loop.rewind_to(snap['iter'])
        if hasattr(wrapper, 'initialize_count_status'):
            # the accumulation count of MMEngine's wrapper follows the
            # iteration count (as after a resume)
            wrapper.initialize_count_status(runner.model, snap['iter'],
                                            runner.max_iters)
        self._sync.rewound()

    # -------------------------------------------------------- rollback --
    def _roll_back(self, runner, cause: str) -> None:
        at = runner.iter + 1
        good = self._good
        files = [f for it, names in self._files
                 if it >= good['iter'] for f in names]
        if is_distributed():
            # every rank rolls back at this iteration: one gather names
            # every rank's samples (a rollback is rare; a healthy step
            # never gathers)
            files = [f for part in all_gather_object(files) for f in part]
        record = dict(number=len(self.rollbacks) + 1, at_iter=at,
                      to_iter=good['iter'], cause=cause,
                      moved_past=[good['iter'] + 1, at],
                      files=len(files))
        if len(self.rollbacks) >= self.max_rollbacks:
            raise MMSafeRuntimeError(self._exhausted(record))
        list_file = self._write_files(runner, record['number'], files)
        record['files_list'] = list_file
        self._restore(runner, good)
        self.rollbacks.append(record)
        self._pending = None
        self._troubled = False
        self._skip_steps.clear()
        self._high_iters = 0
        self._block_iters = 0
        self._snapshot_due = False
        self._files.clear()
        update_counters(CounterKey.ROLLBACK, rollbacks=len(self.rollbacks),
                        last=record)
        if get_rank() == 0:
            write_event(runner.work_dir, Event.ROLLBACK, iter=at - 1,
                        cause=cause, to_iter=good['iter'],
                        number=record['number'],
                        max_rollbacks=self.max_rollbacks,
                        moved_past=record['moved_past'],
                        files_list=list_file, files=files[:200])
        shown = ', '.join(files[:8]) + (
            f' and {len(files) - 8} more' if len(files) > 8 else '')
        state = (f"at the end of iteration {good['iter']}" if good['iter']
                 else 'before the first iteration')
        log('=' * 60 + f'\nROLLBACK {record["number"]} of at most '
            f'{self.max_rollbacks} at Iter(train) {at}: {cause}. Restored '
            f'the state {state} (weights, '
            'optimizer, loss scaler, schedule, random state) on every rank; '
            f"training goes on from iteration {good['iter'] + 1} with new "
            f'data: the {len(files)} samples of iterations '
            f"{good['iter'] + 1}-{at} are not trained again in this pass "
            f'({shown}; all in {list_file or "the rollback event"}).\n' +
            '=' * 60, logging.ERROR)

    def _write_files(self, runner, number: int,
                     files: List[str]) -> Optional[str]:
        """Rank 0 lists the moved-past files of every rank (one per line)
        for ``tools/check_dataset.py --files``; every rank names the
        file."""
        work_dir = getattr(runner, 'work_dir', None)
        if not work_dir:
            return None
        path = osp.join(work_dir, f'rollback_{number}_files.txt')
        if get_rank() == 0:
            text = ''.join(f'{f}\n' for f in files)
            atomic_write(path, lambda f: f.write(text), mode='w')
        return path

    def _exhausted(self, record: Dict[str, Any]) -> str:
        tried = '; '.join(
            f"rollback {r['number']} at Iter(train) {r['at_iter']} to "
            f"iteration {r['to_iter']} ({r['cause']}; {r['files']} samples "
            f"moved past, listed in {r.get('files_list')})"
            for r in self.rollbacks) or 'none'
        return (f"[mmsafe] the run diverged again at Iter(train) "
                f"{record['at_iter']}: {record['cause']}. "
                f'{len(self.rollbacks)} rollbacks were tried '
                f'(max_rollbacks={self.max_rollbacks}): {tried}. The '
                'divergence follows the run, not one data window: lower the '
                'learning rate (or lengthen its warm-up), enable gradient '
                'clipping, and check the listed samples with '
                'tools/check_dataset.py CONFIG --files FILE; resume from '
                'the last checkpoint once fixed.')

"""What a stop checkpoint holds beyond MMEngine's, and what a resume checks.

MMEngine's checkpoint holds the model, the optimizer (with an AMP wrapper's
loss scaler), the parameter schedulers, the message hub (mmsafe's counters
live there) and the loop's epoch and iteration. For a run to continue
*exactly* where it stopped, :class:`~mmsafe.engine.hooks.PreemptionHook`
adds under ``meta['mmsafe_resume']``:

* per rank: the random generators (Python, NumPy, torch CPU and CUDA) at the
  end of the last trained iteration, how many batches of the current epoch
  that rank trained, and (ranks above 0) the model's buffers: under DDP
  each rank keeps its own running statistics, and MMEngine saves rank 0's;
* a fingerprint of the run: world size, train dataset length, the loader's
  effective settings and the training config, flattened.

On a resume :func:`plan_resume` compares that fingerprint with the run that
resumes and returns a :class:`ResumePlan`: which batches of the epoch the
loop replays (loads and discards, so that the loader workers' random
streams reach the state they had), when the generators are put back, and
every reason the continuation cannot be exact. mmsafe's train loops
(:mod:`mmsafe.engine.loops`) carry out the plan; the log and the safety
report say what was continued and whether it is exact.
"""
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from mmsafe.dist import get_rank, get_world_size
from mmsafe.engine.utils import unwrap_model
from mmsafe.events import log, update_counters, write_event
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.rng import RNGState

#: Key of mmsafe's state in a checkpoint's ``meta``.
STATE_KEY = 'mmsafe_resume'

#: Config keys that do not change what training computes (where files go,
#: how it is launched and logged, mmsafe's reporting settings).
IGNORED_CONFIG_KEYS = (
    'work_dir', 'resume', 'load_from', 'launcher', 'env_cfg', 'log_level',
    'log_processor', 'visualizer', 'vis_backends', 'default_hooks.logger',
    'default_hooks.checkpoint', 'default_hooks.timer', 'experiment_name',
    'mmsafe_peer_grace', 'custom_imports', 'gpu_ids', 'val_dataloader',
    'val_evaluator', 'val_cfg', 'test_dataloader', 'test_evaluator',
    'test_cfg', 'train_cfg.val_interval', 'train_cfg.val_begin')


# ------------------------------------------------------------ buffers --
def rank_buffers(model) -> Dict[str, torch.Tensor]:
    """The model's buffers on this rank (CPU copies). Under DDP MMEngine
    does not broadcast buffers, so each rank keeps its own running
    statistics (BatchNorm, MACL's feature centres), and a checkpoint holds
    rank 0's only."""
    return {name: buf.detach().cpu().clone()
            for name, buf in unwrap_model(model).named_buffers()}


def load_rank_buffers(model, buffers: Dict[str, torch.Tensor]) -> List[str]:
    """Copy ``buffers`` (:func:`rank_buffers`) into the model; returns the
    names the model does not have."""
    own = dict(unwrap_model(model).named_buffers())
    missing = []
    with torch.no_grad():
        for name, value in buffers.items():
            if name in own and own[name].shape == value.shape:
                own[name].copy_(value)
            else:
                missing.append(name)
    return missing


# --------------------------------------------------------- fingerprint --
def _flatten(value: Any, prefix: str, out: Dict[str, str]) -> None:
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            _flatten(value[key], f'{prefix}.{key}' if prefix else str(key),
                     out)
    elif isinstance(value, (list, tuple)) and any(
            isinstance(v, dict) for v in value):
        for i, item in enumerate(value):
            _flatten(item, f'{prefix}[{i}]', out)
    else:
        # an object's address (a function in a pure-python config) is not
        # part of the config
        out[prefix] = re.sub(r' at 0x[0-9a-fA-F]+', '', repr(value))


def _ignored(key: str) -> bool:
    return any(key == k or key.startswith(k + '.') or key.startswith(k + '[')
               for k in IGNORED_CONFIG_KEYS)


def training_config(cfg) -> Dict[str, str]:
    """The config as ``{'a.b[0].c': repr(value)}``, without the keys that
    do not change what training computes (:data:`IGNORED_CONFIG_KEYS`)."""
    flat: Dict[str, str] = {}
    _flatten(cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg), '',
             flat)
    return {k: v for k, v in flat.items() if not _ignored(k)}


def _sampler_of(loader) -> Any:
    batch_sampler = getattr(loader, 'batch_sampler', None)
    inner = getattr(batch_sampler, 'sampler', None)
    if hasattr(inner, 'seed'):
        return inner
    return getattr(loader, 'sampler', None)


def loader_facts(loader) -> Dict[str, Any]:
    """What of a train loader decides the data stream of a continuation."""
    sampler = _sampler_of(loader)
    seed = getattr(sampler, 'seed', None)
    return dict(
        num_workers=int(getattr(loader, 'num_workers', 0)),
        persistent_workers=bool(getattr(loader, 'persistent_workers',
                                        False)),
        length=len(loader),
        sampler=type(sampler).__name__,
        sampler_seed=None if seed is None else int(seed))


def run_fingerprint(runner) -> Dict[str, Any]:
    """World size, train dataset length, loader facts, seed, loop type and
    the flattened training config of ``runner``'s run."""
    loop = runner.train_loop
    loader = loop.dataloader
    return dict(
        world_size=get_world_size(),
        dataset_length=len(loader.dataset),
        loader=loader_facts(loader),
        seed=runner.seed,
        loop=type(loop).__name__,
        config=training_config(runner.cfg))


def differences(saved: Dict[str, Any], current: Dict[str, Any],
                limit: int = 12) -> List[str]:
    """What differs between two :func:`run_fingerprint` results that makes
    a continuation inexact, one line each (the loader's effective settings
    are compared when the loader has been probed, by the loop)."""
    found = []
    if saved.get('world_size') != current.get('world_size'):
        found.append(f"world size {saved.get('world_size')} -> "
                     f"{current.get('world_size')} (each rank's share of "
                     'the data and its random state belong to the old '
                     'layout)')
    if saved.get('dataset_length') != current.get('dataset_length'):
        found.append(f"train dataset length {saved.get('dataset_length')} "
                     f"-> {current.get('dataset_length')} (the sampler "
                     'orders other samples)')
    if saved.get('seed') != current.get('seed'):
        found.append(f"seed {saved.get('seed')} -> {current.get('seed')}")
    old_cfg, new_cfg = saved.get('config', {}), current.get('config', {})
    changed = [k for k in sorted(set(old_cfg) | set(new_cfg))
               if old_cfg.get(k) != new_cfg.get(k)]
    for key in changed[:limit]:
        found.append(f"config {key}: {old_cfg.get(key, '(absent)')} -> "
                     f"{new_cfg.get(key, '(absent)')}")
    if len(changed) > limit:
        found.append(f'config: {len(changed) - limit} more keys differ')
    return found


# ---------------------------------------------------------------- plan --
@dataclass
class ResumePlan:
    """How a resumed run continues (see :func:`plan_resume`).

    Attributes:
        checkpoint (str): the checkpoint resumed from.
        epoch (int): the loop's epoch after the resume.
        iter (int): completed training iterations.
        batches_in_epoch (int): batches of ``epoch`` this rank trained
            before the stop; the loop replays (loads and discards) them.
        rng (dict, optional): this rank's generators at the stop, put back
            once the replay is done. None for a checkpoint without them.
        loader (dict, optional): the loader's facts at the stop.
        reasons (list[str]): why the continuation cannot be exact.
        done (bool): the loop has carried the plan out.
    """

    guard_outputs = GuardOutputs(
        Section.RESUMES,
        events=(Event.RESUME_CONTINUATION, ),
        counters=(CounterKey.RESUME_CONTINUATION, ))

    checkpoint: str
    epoch: int
    iter: int
    batches_in_epoch: int = 0
    rng: Optional[Dict[str, Any]] = None
    loader: Optional[Dict[str, Any]] = None
    reasons: List[str] = field(default_factory=list)
    done: bool = False
    by_epoch: bool = True

    @property
    def exact(self) -> bool:
        return not self.reasons

    def finish(self, runner, loader, replayed: int) -> None:
        """Called by the loop when ``replayed`` batches were loaded and
        discarded: checks the effective loader, puts the generators back,
        says what was continued (log, event, counters)."""
        self.done = True
        if self.loader is not None and loader is not None:
            now = loader_facts(loader)
            for key in ('num_workers', 'length', 'sampler', 'sampler_seed'):
                if now.get(key) != self.loader.get(key):
                    self.reasons.append(
                        f'train loader {key} {self.loader.get(key)} -> '
                        f'{now.get(key)}')
        if replayed != self.batches_in_epoch:
            self.reasons.append(
                f'{replayed} of the {self.batches_in_epoch} trained batches '
                'of the epoch were replayed')
        if self.rng is not None:
            RNGState.from_state_dict(self.rng).restore()
        self.report(runner, replayed)

    def report(self, runner, replayed: int = 0) -> None:
        """Log, event and counters of this resume."""
        from mmengine.dist import is_main_process
        if not self.by_epoch:
            where = f'iteration {self.iter}'
        elif self.batches_in_epoch:
            where = (f'epoch {self.epoch + 1}, after batch '
                     f'{self.batches_in_epoch} of the epoch (iteration '
                     f'{self.iter})')
        else:
            where = f'iteration {self.iter} (epoch {self.epoch + 1} starts)'
        if self.exact:
            verdict = ('exact: the same remaining samples in the same '
                       'order, the same random state')
            level = logging.INFO
        else:
            verdict = 'NOT exact: ' + '; '.join(self.reasons)
            level = logging.WARNING
        how = (f' ({replayed} batches replayed through the loader)'
               if replayed else '')
        log(f'resumed from {self.checkpoint} at {where}{how}: {verdict}.',
            level)
        update_counters(CounterKey.RESUME_CONTINUATION,
                        checkpoint=self.checkpoint,
                        epoch=self.epoch, iter=self.iter,
                        batches_in_epoch=self.batches_in_epoch,
                        exact=self.exact, reasons=list(self.reasons))
        if is_main_process():
            write_event(runner.work_dir, Event.RESUME_CONTINUATION,
                        checkpoint=self.checkpoint, epoch=self.epoch,
                        iter=self.iter,
                        batches_in_epoch=self.batches_in_epoch,
                        exact=self.exact, reasons=list(self.reasons))


def _saved_config(meta: Dict[str, Any], reasons: List[str]
                  ) -> Optional[Dict[str, str]]:
    """:func:`training_config` of the config text MMEngine saves in every
    checkpoint's meta (None when there is none; one that does not parse is
    a reason of its own)."""
    text = meta.get('cfg')
    if not isinstance(text, str):
        return None
    from mmengine.config import Config
    try:
        return training_config(Config.fromstring(text, file_format='.py'))
    except Exception as err:  # noqa: BLE001 (reported as a reason)
        reasons.append('the config saved in the checkpoint does not parse '
                       f'({type(err).__name__}: {err}); not compared')
        return None


def plan_resume(runner, checkpoint: Dict[str, Any],
                filename: str) -> ResumePlan:
    """The :class:`ResumePlan` for ``runner`` resuming from ``checkpoint``
    (already loaded by MMEngine's ``Runner.resume``). A train loop that is
    not one of mmsafe's cannot carry the plan out: the resume is reported
    here, as it stands."""
    plan = _plan(runner, checkpoint, filename)
    if not getattr(runner.train_loop, 'continues_inside_epoch', False):
        plan.done = True
        plan.report(runner)
    return plan


def _plan(runner, checkpoint: Dict[str, Any], filename: str) -> ResumePlan:
    meta = checkpoint.get('meta', {}) or {}
    state = meta.get(STATE_KEY)
    plan = ResumePlan(checkpoint=filename, epoch=int(meta.get('epoch', 0)),
                      iter=int(meta.get('iter', 0)))
    loop = runner.train_loop
    from mmengine.runner import IterBasedTrainLoop
    plan.by_epoch = not isinstance(loop, IterBasedTrainLoop)
    if state is None:
        plan.reasons.append(
            'the checkpoint holds no random state (a regular checkpoint: '
            'model, optimizer and schedulers only); the data order of the '
            'next epoch is the same, the random draws are not')
        saved_cfg = _saved_config(meta, plan.reasons)
        if saved_cfg is not None:  # MMEngine keeps the config's text
            plan.reasons += differences(
                dict(config=saved_cfg, seed=meta.get('seed')),
                dict(config=training_config(runner.cfg), seed=runner.seed))
        return plan
    ranks = state.get('ranks', [])
    rank = get_rank()
    mine = ranks[rank] if rank < len(ranks) else None
    plan.reasons += differences(state.get('fingerprint', {}),
                                run_fingerprint(runner))
    if mine is None:
        plan.reasons.append(f'the checkpoint has no state of rank {rank}')
        return plan
    if mine.get('buffers'):
        missing = load_rank_buffers(runner.model, mine['buffers'])
        if missing:
            plan.reasons.append(f'buffers of rank {rank} not in the model: '
                                f'{missing[:5]}')
    plan.batches_in_epoch = int(mine.get('batches_in_epoch', 0))
    plan.rng = mine.get('rng')
    plan.loader = state.get('fingerprint', {}).get('loader')
    if not getattr(loop, 'continues_inside_epoch', False):
        plan.reasons.append(
            f'the train loop {type(loop).__name__} restarts the epoch: its '
            f'first {plan.batches_in_epoch} batches train twice')
    loader = plan.loader or {}
    if (loader.get('persistent_workers') and loader.get('num_workers')
            and getattr(loop, 'replays_from_epoch_start', False)
            and plan.epoch > 0):
        plan.reasons.append(
            'persistent_workers=True: the loader workers carried their '
            'random state over from earlier epochs, which a replay of this '
            'epoch cannot restore (set persistent_workers=False for exact '
            'resumes)')
    return plan

"""Configs and shared 2-process runs for the step-safety tests.

Several scenarios share one real training run where that is honest (their
faults sit at different iterations and each assertion reads only its own
iterations), to keep the suite short on a 2-core machine. Runs are
made once per test session, also across pytest-xdist workers.
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from tests.utils import (RunResult, run_once_per_session, run_train,
                         write_config)

BATCH = 2
WORLD = 2
NUM_SAMPLES = 2 * BATCH * 16
# Generous: two processes importing torch + MMDetection on a loaded machine.
TIMEOUT = 240



def sample_index(rank: int, it: int, slot: int = 0) -> int:
    """Dataset index of ``slot`` in ``rank``'s batch at iteration ``it``."""
    return (rank + WORLD * (it * BATCH + slot)) % NUM_SAMPLES


def fault(rank: int, it: int, kind: str) -> List[Tuple[int, str]]:
    """Faults that put ``kind`` on ``rank``'s batch at iteration ``it``
    (every slot for ``'empty'``, the first slot otherwise)."""
    slots = range(BATCH) if kind == 'empty' else [0]
    return [(sample_index(rank, it, s), kind) for s in slots]


def file_of(rank: int, it: int, slot: int = 0) -> str:
    return f'toy/vis/{sample_index(rank, it, slot):04d}.png'


def make_config(work_dir: str, faults: Sequence[Tuple[int, str]],
                max_iters: int, optim_wrapper: str,
                hooks: Sequence[str] = ("dict(type='EmptyBatchSyncHook')", ),
                checkpoint_interval: Optional[int] = None) -> str:
    """Write a toy training config; returns its path."""
    hook_lines = ', '.join(list(hooks) + ["dict(type='StepDumpHook')"])
    checkpoint = (f"dict(type='CheckpointHook', by_epoch=False, "
                  f'interval={checkpoint_interval})'
                  if checkpoint_interval else 'None')
    return write_config(
        osp.join(work_dir, 'toy_cfg.py'), f"""
        default_scope = 'mmdet'
        custom_imports = dict(
            imports=['mmsafe', 'tests.engine.step_toys'],
            allow_failed_imports=False)
        work_dir = {work_dir!r}
        model = dict(type='StepToyDetector')
        train_dataloader = dict(
            batch_size={BATCH}, num_workers=1, persistent_workers=False,
            sampler=dict(type='InfiniteSampler', shuffle=False),
            dataset=dict(type='StepToyDataset', num_samples={NUM_SAMPLES},
                         faults={list(faults)!r}))
        train_cfg = dict(type='IterBasedTrainLoop', max_iters={max_iters},
                         val_interval=100000)
        optim_wrapper = {optim_wrapper}
        param_scheduler = []
        custom_hooks = [{hook_lines}]
        default_hooks = dict(
            timer=dict(type='IterTimerHook'),
            logger=dict(type='LoggerHook', interval=1),
            param_scheduler=dict(type='ParamSchedulerHook'),
            checkpoint={checkpoint},
            sampler_seed=dict(type='DistSamplerSeedHook'))
        log_processor = dict(by_epoch=False)
        env_cfg = dict(cudnn_benchmark=False,
                       mp_cfg=dict(mp_start_method='fork',
                                   opencv_num_threads=0),
                       dist_cfg=dict(backend='gloo'))
        randomness = dict(seed=0)
        log_level = 'INFO'
        """)


def sgd_wrapper(kind: str = 'NaNSkipOptimWrapper', **extra) -> str:
    """Config text of an optim wrapper with momentum and weight decay (so a
    wrongly taken step always moves the parameters)."""
    args = ''.join(f', {k}={v!r}' for k, v in extra.items())
    return (f"dict(type={kind!r}, optimizer=dict(type='SGD', lr=0.05, "
            f'momentum=0.9, weight_decay=0.01){args})')


def train(name: str, faults: Sequence[Tuple[int, str]], max_iters: int,
          optim_wrapper: str, timeout: float = TIMEOUT,
          args: Sequence[str] = (), env: Optional[dict] = None,
          **config_kw) -> Tuple[str, RunResult]:
    """Run (once per test session, see ``run_once_per_session``) a 2-rank
    gloo training of the toys."""
    def run(tmp):
        work_dir = osp.join(tmp, name)
        cfg = make_config(work_dir, faults, max_iters, optim_wrapper,
                          **config_kw)
        return work_dir, run_train(cfg, nproc=WORLD, timeout=timeout,
                                   args=args, env=env)
    return run_once_per_session(f'step_toys_{name}', run)


def dumps(work_dir: str) -> List[dict]:
    """Both ranks' dumps written by ``StepDumpHook``."""
    return [
        torch.load(osp.join(work_dir, f'step_dump_rank{r}.pt'),
                   weights_only=False) for r in range(WORLD)
    ]


def bit_identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (so NaN == NaN)."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(
        (a.contiguous().view(torch.uint8) == b.contiguous().view(
            torch.uint8)).all())


def assert_ranks_identical(work_dir: str, finite: bool = True) -> List[dict]:
    """Parameters equal bit for bit on both ranks (and finite)."""
    d0, d1 = dumps(work_dir)
    assert d0['state_dict'].keys() == d1['state_dict'].keys()
    for key, value in d0['state_dict'].items():
        assert bit_identical(value, d1['state_dict'][key]), key
        if finite:
            assert torch.isfinite(value).all(), key
    return [d0, d1]


def checksums(dump: dict) -> Dict[int, float]:
    """Parameter checksum after each iteration."""
    return {r['iter']: r['checksum'] for r in dump['records']}


# --------------------------------------------------------------------- #
# The shared runs
GUARDED_ITERS = 8
# (a) NaN loss on rank 1 at iterations 1 and 4; (b) NaN gradient with a
# finite loss on rank 0 at iteration 3; (c) rank 1's batch empty at
# iteration 5; (d) every rank's batch empty at iteration 6 (it trains).
GUARDED_FAULTS = (fault(1, 1, 'nan_loss') + fault(1, 4, 'nan_loss')
                  + fault(0, 3, 'nan_grad') + fault(1, 5, 'empty')
                  + fault(0, 6, 'empty') + fault(1, 6, 'empty'))


def guarded_run() -> Tuple[str, RunResult]:
    """fp32 NaNSkipOptimWrapper + EmptyBatchSyncHook through (a)-(d),
    ``find_unused_parameters=False`` (MMEngine's default), with a final
    checkpoint for the resume test."""
    return train('guarded', GUARDED_FAULTS, GUARDED_ITERS, sgd_wrapper(),
                 checkpoint_interval=GUARDED_ITERS)


# ``EmptyBatchSyncHook(skip_all_empty=True)``: every rank empty at 2 (the
# opt-in skip); every rank without any signal at 4 (``zero_grad``).
OPT_IN_ITERS = 6
OPT_IN_FAULTS = (fault(0, 2, 'empty') + fault(1, 2, 'empty')
                 + fault(0, 4, 'zero_loss') + fault(1, 4, 'zero_loss'))


def opt_in_run() -> Tuple[str, RunResult]:
    return train('opt_in', OPT_IN_FAULTS, OPT_IN_ITERS, sgd_wrapper(),
                 hooks=("dict(type='EmptyBatchSyncHook', "
                        'skip_all_empty=True)', ))


# Without mmsafe's optim wrapper: EmptyBatchSyncHook must still keep the
# ranks consistent on its own (rank 1 empty at its very first iteration,
# both ranks empty at 2); the NaN loss on rank 1 at iteration 3 is the
# control of (a).
UNMANAGED_ITERS = 5
UNMANAGED_FAULTS = (fault(1, 0, 'empty') + fault(0, 2, 'empty')
                    + fault(1, 2, 'empty') + fault(1, 3, 'nan_loss'))


def unmanaged_run() -> Tuple[str, RunResult]:
    return train('unmanaged', UNMANAGED_FAULTS, UNMANAGED_ITERS,
                 sgd_wrapper('OptimWrapper'))


def control_empty_run() -> Tuple[str, RunResult]:
    """Control for (c): MMEngine's OptimWrapper, no EmptyBatchSyncHook,
    rank 1's batch empty at iteration 1. Short timeout: a hang is a
    result here, not a reason to wait."""
    return train('control_empty', fault(1, 1, 'empty'), 4,
                 sgd_wrapper('OptimWrapper'), timeout=120, hooks=())

"""Configs and shared runs of the spike and rollback tests on the demo
detector (the dual-stream Faster R-CNN with MACL of
``configs/llvip/demo_cpu.py``), made once per test session.

The demo trains its BatchNorm statistics from scratch, and trainable
BatchNorm absorbs an out-of-range image's scale (``benchmarks/
grad_spikes.py``: a raw 16-bit infrared frame moves the gradient norm
0.1x-10x there). The runs here use the LLVIP recipe's settings where
it matters: its backbones' BatchNorm (``norm_eval=True``,
``frozen_stages=1``) and its optimizer (SGD with momentum, ``clip_grad``
35; lr 0.02 for these short runs), on the demo's tiny detector and
synthetic data; there a raw 16-bit infrared frame raises the gradient norm
36x-5700x.

Faulty samples are chosen from the sampler's own order
(``InfiniteSampler(shuffle=True, seed=SEED)``) so that every occurrence
lands after the spike window is full, in a batch of its own.
"""
import os.path as osp
import re
import tempfile
from typing import Dict, List, Sequence, Tuple

import torch

from tests.utils import (REPO_ROOT, RunResult, run_once_per_session,
                         run_train, write_config)

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
NUM_TRAIN = 300
BATCH = 4
SEED = 0
MAX_ITERS = 300  # four passes over the data in a single process
WINDOW = 32  # spike window of these short runs (the default is 128)
TIMEOUT = 420
SGD = ("dict(optimizer=dict(_delete_=True, type='SGD', lr=0.02, "
       "momentum=0.9, weight_decay=0.0001), clip_grad=dict(max_norm=35, "
       'norm_type=2))')

CONFIG = """
_base_ = [{demo!r}]
custom_imports = dict(
    imports=['mmsafe', 'tests.engine.step_toys', 'tests.engine.spike_toys'],
    allow_failed_imports=False)
work_dir = {work_dir!r}
model = dict(backbone=dict(norm_eval=True, frozen_stages=1),
             ir_backbone=dict(norm_eval=True, frozen_stages=1))
train_dataloader = dict(
    sampler=dict(_delete_=True, type='InfiniteSampler', shuffle=True,
                 seed={seed}),
    dataset=dict(data_root={data_root!r}, pipeline=[
        dict(type='LoadPairedImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True),
        dict(type='RawCountsInfrared', stems={stems!r}),
        dict(type='PairedResize', scale=(160, 128), keep_ratio=True),
        dict(type='PairedRandomFlip', prob=0.5),
        dict(type='PackPairedDetInputs')]))
val_dataloader = dict(dataset=dict(data_root={data_root!r}))
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop',
                 max_iters={max_iters}, val_interval={max_iters})
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=50),
    dict(type='CosineAnnealingLR', begin=0, end={max_iters}, by_epoch=False,
         eta_min_ratio=0.05)]
optim_wrapper = {optim_wrapper}
mmsafe_spike_skip = {spike}
default_hooks = dict(logger=dict(type='LoggerHook', interval=1),
                     checkpoint=dict(type='CheckpointHook', interval=100000))
log_processor = dict(by_epoch=False, window_size=1)
custom_hooks = _base_.custom_hooks + {hooks}
randomness = dict(seed={seed})
"""


def data_root() -> str:
    """The synthetic demo tree of this session (created by the first run
    that needs it; creation is race-safe)."""
    return osp.join(tempfile.gettempdir(), 'mmsafe-shared-runs',
                    'llvip_spike') + '/'


def stream(num_samples: int, length: int, seed: int = SEED) -> List[int]:
    """The first ``length`` sample indices of ``InfiniteSampler(shuffle=True,
    seed=seed)`` (every rank takes its slice of this stream)."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    out: List[int] = []
    while len(out) < length:
        out += torch.randperm(num_samples, generator=gen).tolist()
    return out[:length]


def iterations_of(index: int, world: int, max_iters: int
                  ) -> List[Tuple[int, int]]:
    """``(rank, iteration)`` of every occurrence of sample ``index``."""
    order = stream(NUM_TRAIN, world * BATCH * max_iters)
    return [(pos % world, (pos // world) // BATCH)
            for pos, i in enumerate(order) if i == index]


def faulty_samples(world: int, max_iters: int, count: int = 3,
                   min_occurrences: int = 2
                   ) -> Dict[int, List[Tuple[int, int]]]:
    """``count`` samples that occur at least ``min_occurrences`` times,
    every time after the spike window is full, in iterations at least two
    apart from another faulty sample's, on every rank in turn;
    index -> ``(rank, iteration)`` occurrences."""
    chosen: Dict[int, List[Tuple[int, int]]] = {}
    taken: set = set()
    for index in range(NUM_TRAIN - 1, -1, -1):
        occurrences = iterations_of(index, world, max_iters)
        iters = {it for _, it in occurrences}
        want_rank = len(chosen) % world
        if len(occurrences) >= min_occurrences and \
                min(iters) > WINDOW + 2 and not iters & taken and \
                occurrences[0][0] == want_rank:
            chosen[index] = occurrences
            taken |= {it + d for it in iters for d in (-1, 0, 1)}
        if len(chosen) == count:
            break
    return chosen


def stem(index: int) -> str:
    return f'{10001 + index:06d}'


def train(name: str, stems: Sequence[str], spike: str, nproc: int = 1,
          max_iters: int = MAX_ITERS, optim_wrapper: str = SGD,
          hooks: Sequence[str] = ()) -> Tuple[str, RunResult]:
    """Train once per session; returns ``(work_dir, result)``."""
    def run(tmp):
        work_dir = osp.join(tmp, name)
        cfg = write_config(osp.join(tmp, f'{name}.py'), CONFIG.format(
            demo=DEMO, work_dir=work_dir, data_root=data_root(),
            stems=list(stems), max_iters=max_iters, seed=SEED,
            optim_wrapper=optim_wrapper, spike=spike,
            hooks='[' + ', '.join(hooks) + ']'))
        return work_dir, run_train(cfg, nproc=nproc, timeout=TIMEOUT)
    return run_once_per_session(f'spike_{name}', run)


def map50(result: RunResult) -> float:
    """The final ``pascal_voc/mAP`` (AP at IoU 0.5) of a run's log."""
    found = re.findall(r'val/pascal_voc/mAP: ([0-9.]+)', result.output)
    assert found, result
    return float(found[-1])


def per_iteration(result: RunResult, key: str) -> Dict[int, float]:
    """``{iteration (1-based): value}`` of a logged training scalar (the
    runs log every iteration, unsmoothed)."""
    values = {}
    for line in result.output.splitlines():
        match = re.search(r'Iter\(train\) \[ *(\d+)/\d+\]', line)
        value = re.search(rf'  {key}: ([-0-9.e+a-z]+)', line)
        if match and value:
            values[int(match.group(1))] = float(value.group(1))
    return values


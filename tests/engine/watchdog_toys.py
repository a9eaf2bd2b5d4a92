"""Toy components and fault injectors for the HangWatchdogHook tests.
Configs load them with
``custom_imports=dict(imports=['mmsafe', 'tests.engine.watchdog_toys'])``."""
import time
from typing import Optional

import torch
import torch.nn as nn
from mmengine.dist import get_rank
from mmengine.model import BaseModel
from torch.utils.data import Dataset

from mmdet.registry import DATASETS, MODELS


@MODELS.register_module()
class SleepyToyModel(BaseModel):
    """A linear regressor whose forward sleeps at one training iteration.

    Args:
        stall_iter (int): 0-based training iteration at which to sleep.
        stall_seconds (float): how long to sleep.
        stall_rank (int, optional): only this rank sleeps; all when None.
    """

    def __init__(self, stall_iter: int = 2, stall_seconds: float = 10.,
                 stall_rank: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        self.linear = nn.Linear(4, 1)
        self.stall_iter = stall_iter
        self.stall_seconds = stall_seconds
        self.stall_rank = stall_rank
        self._train_calls = 0

    def forward(self, inputs, mode='tensor'):
        x = torch.stack(inputs).float()
        if mode == 'loss':
            if self._train_calls == self.stall_iter and (
                    self.stall_rank is None or get_rank() == self.stall_rank):
                _sleep_past_watchdog(self.stall_seconds)
            self._train_calls += 1
            out = self.linear(x)
            return dict(loss=(out - x.sum(1, keepdim=True)).pow(2).mean())
        return self.linear(x)


def _sleep_past_watchdog(seconds: float) -> None:
    """The stall that the hang report must name."""
    time.sleep(seconds)


@DATASETS.register_module()
class SleepyToyDataset(Dataset):
    """``length`` fixed 4-vectors."""

    metainfo = dict(classes=('thing', ))

    def __init__(self, length: int = 16):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int) -> dict:
        return dict(inputs=torch.full((4, ), float(idx) / self.length))

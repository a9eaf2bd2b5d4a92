"""Snapshot and restore of the global random generators.

Guards that run extra work before or during training (probing a
DataLoader, re-running the first batch) must leave every random stream
exactly where training would have found it: Python's ``random``, NumPy's
global generator, torch's CPU generator and every CUDA device's.
"""
import random
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch


class RNGState:
    """A snapshot of the Python, NumPy and torch (CPU, CUDA) generators."""

    def __init__(self) -> None:
        self.py = random.getstate()
        self.np = np.random.get_state()
        self.torch = torch.get_rng_state()
        self.cuda = (torch.cuda.get_rng_state_all()
                     if torch.cuda.is_available() else None)

    def restore(self) -> None:
        """Put every generator back to the snapshot."""
        random.setstate(self.py)
        np.random.set_state(self.np)
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


@contextmanager
def preserved_rng_state() -> Iterator[RNGState]:
    """Run a block, then restore every global generator to its state before
    the block, also when the block raises."""
    state = RNGState()
    try:
        yield state
    finally:
        state.restore()

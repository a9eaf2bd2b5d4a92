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

    def state_dict(self) -> dict:
        """The snapshot as values that ``torch.load`` reads with
        ``weights_only=True`` (tensors, lists, numbers, strings), for a
        checkpoint."""
        version, internal, gauss_next = self.py
        name, keys, pos, has_gauss, gauss = self.np
        return dict(
            python=[version, list(internal), gauss_next],
            numpy=[name, torch.from_numpy(keys.astype(np.int64)), int(pos),
                   int(has_gauss), float(gauss)],
            torch=self.torch, cuda=list(self.cuda or []))

    @classmethod
    def from_state_dict(cls, state: dict) -> 'RNGState':
        """The snapshot that :meth:`state_dict` wrote. Its tensors may be on
        any device (MMEngine's ``resume`` loads a checkpoint onto the
        training device); CUDA states are kept where CUDA is available."""
        snapshot = cls.__new__(cls)
        version, internal, gauss_next = state['python']
        snapshot.py = (version, tuple(internal), gauss_next)
        name, keys, pos, has_gauss, gauss = state['numpy']
        snapshot.np = (name, keys.cpu().numpy().astype(np.uint32), pos,
                       has_gauss, gauss)
        snapshot.torch = state['torch'].cpu()
        snapshot.cuda = ([s.cpu() for s in state['cuda']]
                         if state['cuda'] and torch.cuda.is_available()
                         else None)
        return snapshot


@contextmanager
def preserved_rng_state() -> Iterator[RNGState]:
    """Run a block, then restore every global generator to its state before
    the block, also when the block raises."""
    state = RNGState()
    try:
        yield state
    finally:
        state.restore()

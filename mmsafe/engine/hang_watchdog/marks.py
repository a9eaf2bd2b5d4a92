"""Heartbeat marks from PyTorch's extension points: forward hooks on the
model and its data preprocessor, step hooks on the optimizers."""
import threading
from typing import List

import torch.nn as nn

from . import heartbeat as ph
from .heartbeat import Heartbeat


class PhaseMarks:
    """Mark ``heartbeat`` from hooks registered on a model and optimizers.

    Invariants: only the main thread marks (a forward in another thread is
    not this rank's training step); only the first forward after
    :meth:`new_iteration` changes the phase (a hook's extra forward only
    marks progress); :meth:`detach` removes every handle it registered.

    Args:
        heartbeat (Heartbeat): what to mark.
    """

    def __init__(self, heartbeat: Heartbeat) -> None:
        self.heartbeat = heartbeat
        self.stage = 'train'  # or 'validation', 'test'
        self.ddp = False
        self._forwarded = False
        self._handles: List = []

    def phase(self, what: str) -> str:
        """The phase ``what`` of an evaluation (``'validation (forward)'``)
        or ``what`` itself in training."""
        return what if self.stage == 'train' else ph.eval_phase(
            self.stage, what)

    def new_iteration(self) -> None:
        self._forwarded = False

    # ------------------------------------------------------------------ #
    def attach(self, model: nn.Module, optim_wrapper, ddp: bool) -> None:
        """Register on ``model`` (unwrapped), its ``data_preprocessor`` and
        the optimizer(s) of ``optim_wrapper`` (an ``OptimWrapper`` or
        ``OptimWrapperDict``; anything else, e.g. the config of a run that
        does not train, is skipped)."""
        from mmengine.optim import OptimWrapper, OptimWrapperDict
        self.ddp = ddp
        preprocessor = getattr(model, 'data_preprocessor', None)
        if isinstance(preprocessor, nn.Module):
            self._handles.append(
                preprocessor.register_forward_pre_hook(self._preprocess))
        self._handles.append(model.register_forward_pre_hook(self._forward))
        self._handles.append(model.register_forward_hook(self._forwarded_))
        wrappers = list(optim_wrapper.optim_wrappers.values()) if isinstance(
            optim_wrapper, OptimWrapperDict) else [optim_wrapper]
        for wrapper in wrappers:
            if isinstance(wrapper, OptimWrapper):
                optimizer = wrapper.optimizer
                self._handles.append(
                    optimizer.register_step_pre_hook(self._step))
                self._handles.append(
                    optimizer.register_step_post_hook(self._stepped))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # ------------------------------------------------------------------ #
    @staticmethod
    def _main() -> bool:
        return threading.current_thread() is threading.main_thread()

    def _preprocess(self, module, args) -> None:
        if self._main():
            self.heartbeat.beat(
                None if self._forwarded else self.phase(ph.PREPROCESS))

    def _forward(self, module, args) -> None:
        if self._main():
            self.heartbeat.beat(
                None if self._forwarded else self.phase(ph.FORWARD))

    def _forwarded_(self, module, args, output) -> None:
        if not self._main():
            return
        if self._forwarded:
            self.heartbeat.beat()
            return
        self._forwarded = True
        if self.stage == 'train':
            self.heartbeat.beat(ph.BACKWARD_DDP if self.ddp else ph.BACKWARD)
        else:
            event = 'val' if self.stage == 'validation' else self.stage
            self.heartbeat.beat(self.phase(
                f'metric processing, after_{event}_iter hooks'))

    def _step(self, optimizer, args, kwargs) -> None:
        if self._main():
            self.heartbeat.beat(ph.STEP)

    def _stepped(self, optimizer, args, kwargs) -> None:
        if self._main():
            self.heartbeat.beat(ph.AFTER_STEP)

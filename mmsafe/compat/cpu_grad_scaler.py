"""A CPU GradScaler for torch releases that have none.

``torch.amp.GradScaler('cpu')`` exists on newer torch, backed by CPU kernels
of ``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_``.
Older torch (2.1, 2.2) has only ``torch.cuda.amp.GradScaler``, which refuses
CPU tensors and has no CPU kernels. :class:`CpuGradScaler` is that class with
the device checks lifted and the two kernels written as ordinary tensor ops
with the same arithmetic:

* unscale: every gradient is multiplied by ``1 / scale`` (computed in
  float64, stored in float32), and ``found_inf`` becomes 1 when any of them
  holds an inf or NaN;
* update: on ``found_inf`` the scale is multiplied by ``backoff_factor`` and
  the growth tracker reset; otherwise the tracker counts up, and when it
  reaches ``growth_interval`` the scale is multiplied by ``growth_factor``
  (if that stays finite) and the tracker reset.

:func:`mmsafe.compat.grad_scaler` returns it only where torch has no CPU
GradScaler; state dicts are the same as torch's.
"""
import sys
from collections import abc, defaultdict
from typing import Dict

import torch
from torch.cuda.amp import GradScaler as _TorchGradScaler

from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError


def _fresh_optimizer_state() -> dict:
    """torch's per-optimizer bookkeeping (the stage and the found_inf
    dict), from the module that defines the GradScaler in use."""
    for cls in _TorchGradScaler.__mro__:
        module = sys.modules.get(cls.__module__)
        fresh = getattr(module, '_refresh_per_optimizer_state', None)
        if fresh is not None:
            return fresh()
    raise MMSafeRuntimeError('torch has no GradScaler bookkeeping to extend')


class CpuGradScaler(_TorchGradScaler):
    """``torch.cuda.amp.GradScaler`` that runs on CPU tensors.

    Args: those of ``torch.amp.GradScaler`` without the device.
    """

    def __init__(self,
                 init_scale: float = 2.0**16,
                 growth_factor: float = 2.0,
                 backoff_factor: float = 0.5,
                 growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        # torch's constructor disables itself without CUDA; set up the same
        # fields it sets for an enabled scaler instead.
        super().__init__(enabled=False)
        self._enabled = enabled
        if enabled:
            assert growth_factor > 1.0, 'The growth factor must be > 1.0.'
            assert backoff_factor < 1.0, 'The backoff factor must be < 1.0.'
            self._init_scale = init_scale
            self._scale = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker = None
            self._per_optimizer_states = defaultdict(_fresh_optimizer_state)

    def scale(self, outputs):
        """``outputs`` times the current scale (a tensor or an iterable of
        them), unchanged when disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            return outputs * self._scale.to(device=outputs.device)
        if isinstance(outputs, abc.Iterable):
            scaled = map(self.scale, outputs)
            return type(outputs)(scaled) if isinstance(
                outputs, (list, tuple)) else scaled
        raise MMSafeValueError(
            'outputs must be a Tensor or an iterable of Tensors')

    def _unscale_grads_(self, optimizer, inv_scale: torch.Tensor,
                        found_inf: torch.Tensor,
                        allow_fp16: bool) -> Dict[torch.device, torch.Tensor]:
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group['params']:
                    if param.grad is None:
                        continue
                    if not allow_fp16 and param.grad.dtype == torch.float16:
                        raise MMSafeValueError('Attempting to unscale FP16 '
                                               'gradients.')
                    grad = param.grad
                    if grad.is_sparse:
                        if grad.dtype is torch.float16:
                            param.grad = grad = grad.coalesce()
                        grad = grad._values()
                    nonfinite = (~torch.isfinite(grad)).any()
                    found_inf.copy_(torch.maximum(
                        found_inf, nonfinite.to(found_inf.dtype)))
                    # 0-d: a 0-d gradient (a scalar parameter such as a
                    # learned temperature) takes no (1,)-shaped factor in
                    # place
                    grad.mul_(inv_scale.to(grad.device).reshape(()))
        return {found_inf.device: found_inf}

    def update(self, new_scale=None) -> None:
        """torch's ``GradScaler.update`` (see the module docstring)."""
        if not self._enabled:
            return
        scale, tracker = self._check_scale_growth_tracker('update')
        if new_scale is not None:
            if isinstance(new_scale, torch.Tensor):
                assert new_scale.numel() == 1 and not new_scale.requires_grad
                scale.copy_(new_scale)
            else:
                scale.fill_(float(new_scale))
        else:
            found_infs = [
                found.to(scale.device)
                for state in self._per_optimizer_states.values()
                for found in state['found_inf_per_device'].values()
            ]
            assert found_infs, 'No inf checks were recorded prior to update.'
            if sum(float(f) for f in found_infs):
                scale.mul_(self._backoff_factor)
                tracker.fill_(0)
            elif int(tracker) + 1 == self._growth_interval:
                grown = scale * self._growth_factor
                if torch.isfinite(grown):
                    scale.copy_(grown)
                tracker.fill_(0)
            else:
                tracker.add_(1)
        self._per_optimizer_states = defaultdict(_fresh_optimizer_state)

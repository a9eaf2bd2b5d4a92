"""Mixed-precision NaN-skip optim wrapper that runs on CUDA and on CPU."""
from contextlib import contextmanager
from typing import List, Optional, Union

import torch
import torch.nn as nn

from mmsafe.registry import OPTIM_WRAPPERS
from mmsafe.compat import autocast_dtype, cpu_autocast_dtypes, grad_scaler
from mmsafe.errors import MMSafeRuntimeError, MMSafeTypeError, MMSafeValueError
from .cpu_autocast_errors import cpu_autocast_op_message, mmcv_op_frame
from .nan_skip_optim_wrapper import NaNSkipOptimWrapper
from .skip_report import AMP_OVERFLOW, NONFINITE_GRAD

_SCALER_ARGS = ('init_scale', 'growth_factor', 'backoff_factor',
                'growth_interval', 'enabled')

_VALID_DTYPES = ('float16', 'bfloat16', 'float32', 'float64')


@OPTIM_WRAPPERS.register_module()
class AmpNaNSkipOptimWrapper(NaNSkipOptimWrapper):
    """:class:`NaNSkipOptimWrapper` with automatic mixed precision: a
    drop-in for MMEngine's ``AmpOptimWrapper`` that also works without a GPU
    (``torch.autocast('cpu')`` and a CPU GradScaler: torch's own where it
    has one, :class:`~mmsafe.compat.cpu_grad_scaler.CpuGradScaler` on older
    torch), so CI can exercise it. CPU autocast in float16 needs a torch
    that has it (bfloat16 works on every supported torch); asking for it on
    one that has not is refused when the wrapper is built.

    It accepts every configuration that ``AmpOptimWrapper`` accepts
    (float16 or bfloat16; a dynamic, static, dict-configured or disabled
    ``GradScaler``) and, on a healthy step, updates the weights exactly as
    ``AmpOptimWrapper`` does: unscale, optional clipping, ``scaler.step``,
    ``scaler.update``.

    The GradScaler stays legal on every path: gradients are unscaled exactly
    once per optimizer step (before the gradient norm is measured, so the
    norm and the clipping see true values), and ``scaler.update()`` runs on
    every step, applied or skipped, after the inf checks were recorded. The
    scaler's overflow check reads the all-reduced gradients, so the loss
    scale moves alike on every rank. A disabled scaler
    (``loss_scale=dict(enabled=False)``) does nothing: the skip decision
    then comes from the gradient norm alone, as without AMP.

    A skip caused by a non-finite loss counts as a NaN skip; a skip with
    finite losses but non-finite scaled gradients counts as an fp16 overflow
    (``train/amp_overflows``), which is normal while the dynamic loss scale
    settles early in training.

    On CPU, mmcv's NMS / RoIAlign / RoIPool kernels take float32 only; the
    model must call them on float32 tensors with autocast disabled
    (:class:`DualStreamFasterRCNN` does). A model that does not fails in
    the forward with a ``RuntimeError`` from this wrapper that names the op
    and the fix (the kernel's own error is its cause).

    Args:
        loss_scale (float | str | dict): ``'dynamic'`` (default GradScaler),
            a number (static scale) or a dict of ``GradScaler`` arguments
            (``init_scale``, ``growth_factor``, ``backoff_factor``,
            ``growth_interval``, ``enabled``). Defaults to ``'dynamic'``.
        dtype (str | torch.dtype, optional): autocast dtype. None uses the
            device's autocast default (float16 on CUDA, bfloat16 on CPU).
        device_type (str, optional): ``'cuda'`` or ``'cpu'``. None picks
            CUDA when available.
        **kwargs: arguments of :class:`NaNSkipOptimWrapper`.
    """

    def __init__(self,
                 loss_scale: Union[str, float, dict] = 'dynamic',
                 dtype: Optional[Union[str, torch.dtype]] = None,
                 device_type: Optional[str] = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if device_type is None:
            device_type = 'cuda' if torch.cuda.is_available() else 'cpu'
        self.device_type = device_type
        self._scale_update_param = None
        if loss_scale == 'dynamic':
            self.loss_scaler = grad_scaler(device_type)
        elif isinstance(loss_scale, (int, float)) and not isinstance(
                loss_scale, bool):
            self._scale_update_param = float(loss_scale)
            self.loss_scaler = grad_scaler(device_type,
                                           init_scale=float(loss_scale))
        elif isinstance(loss_scale, dict):
            unknown = sorted(set(loss_scale) - set(_SCALER_ARGS))
            if unknown:
                raise MMSafeTypeError(
                    f'unknown GradScaler arguments {unknown} in '
                    f'loss_scale; valid: {list(_SCALER_ARGS)}')
            self.loss_scaler = grad_scaler(device_type, **loss_scale)
        else:
            raise MMSafeTypeError('loss_scale must be a float, a dict or '
                                  f'"dynamic", got {loss_scale!r}')
        if isinstance(dtype, str):
            if dtype not in _VALID_DTYPES:
                raise MMSafeValueError(
                    f'dtype must be one of {_VALID_DTYPES}, got '
                    f'{dtype!r}')
            dtype = getattr(torch, dtype)
        if device_type == 'cpu' and dtype in (torch.float16, torch.bfloat16) \
                and dtype not in cpu_autocast_dtypes():
            usable = [str(d).replace('torch.', '')
                      for d in cpu_autocast_dtypes()]
            raise MMSafeValueError(
                f'CPU autocast of this torch ({torch.__version__}) supports '
                f'{usable} only, not {str(dtype).replace("torch.", "")}: set '
                f"optim_wrapper.dtype='bfloat16' (or leave it out), or train "
                'on a GPU / a newer torch for float16 on the CPU.')
        self.cast_dtype = dtype

    @contextmanager
    def optim_context(self, model: nn.Module):
        """Autocast on :attr:`device_type`, plus the base class's context.

        Raises:
            RuntimeError: on CPU, when an mmcv op in the forward rejects the
                autocast dtype (chained to the op's error).
        """
        with super().optim_context(model), torch.autocast(
                device_type=self.device_type, dtype=self.cast_dtype):
            try:
                yield
            except (RuntimeError, NotImplementedError) as exc:
                frame = (mmcv_op_frame(exc)
                         if self.device_type == 'cpu' else None)
                if frame is None:
                    raise
                raise MMSafeRuntimeError(
                    cpu_autocast_op_message(
                        frame, exc, autocast_dtype('cpu'))) from exc

    def _is_amp(self) -> bool:
        return True

    def _backward(self, loss: torch.Tensor, **kwargs) -> None:
        scaled = self.loss_scaler.scale(loss)
        if kwargs.get('gradient') is not None:
            # the scale is a 1-element tensor: the scaled loss of a 0-d
            # loss has shape (1,), and torch 2.0 takes only a seed of the
            # output's own shape
            kwargs['gradient'] = kwargs['gradient'].reshape(scaled.shape)
        scaled.backward(**kwargs)

    def _scaling(self) -> bool:
        return self.loss_scaler.is_enabled()

    def _found_inf(self) -> dict:
        state = self.loss_scaler._per_optimizer_states[id(self.optimizer)]
        return state['found_inf_per_device']

    def _unscale(self) -> None:
        if not self._scaling():
            return
        self.loss_scaler.unscale_(self.optimizer)
        found_inf = self._found_inf()
        if not found_inf:
            # No parameter had a gradient: record a clean check, otherwise
            # step()/update() assert "No inf checks were recorded".
            found_inf[torch.device(self.device_type)] = torch.zeros(
                (), dtype=torch.float32,
                device=self.loss_scaler._scale.device
                if self.loss_scaler._scale is not None else 'cpu')

    def _nonfinite_reason(self) -> str:
        # With a scaler, non-finite gradients with finite losses are the
        # loss scale's overflow; without one, a real NaN/Inf.
        return AMP_OVERFLOW if self._scaling() else NONFINITE_GRAD

    def _optimizer_step(self, **kwargs) -> None:
        self.loss_scaler.step(self.optimizer, **kwargs)
        self.loss_scaler.update(self._scale_update_param)

    def _skip_step(self, reasons: List[str]) -> None:
        # No scaler.step(): the optimizer must not move. update() consumes
        # the recorded inf checks (and backs off the scale on overflow), so
        # the next iteration starts from a clean scaler. The checks were
        # taken on the all-reduced gradients: the same on every rank.
        if self._scaling():
            self.loss_scaler.update(self._scale_update_param)

    def state_dict(self) -> dict:
        """Optimizer, skip counters and ``loss_scaler`` state."""
        state = super().state_dict()
        state['loss_scaler'] = self.loss_scaler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore optimizer, skip counters and ``loss_scaler``."""
        state_dict = dict(state_dict)
        scaler_state = state_dict.pop('loss_scaler', None)
        if scaler_state is not None:
            self.loss_scaler.load_state_dict(scaler_state)
        super().load_state_dict(state_dict)

"""Run mmcv's compiled ops in float32 under CPU autocast.

mmcv's CPU kernels (NMS, RoIAlign, RoIPool) accept float32 only. Under
``torch.autocast('cpu')`` the convolutions before them produce bfloat16 or
float16, so a detector fails deep inside MMDetection with ``expected scalar
type Float but found BFloat16``. CUDA kernels take half precision, so this
is a CPU-only shim, installed by :class:`AmpNaNSkipOptimWrapper` on CPU.

The patched ops cast half-precision CPU tensors to float32, run with
autocast disabled and cast floating outputs back to the input's dtype (the
callers write them into tensors of that dtype). RoIAlign/RoIPool are
patched at their ``nn.Module`` so that the casts are ordinary autograd ops
and the backward kernels see float32 too; NMS has no gradient and is
patched at its autograd Function.
"""
import functools
import importlib
import logging

import torch

#: (module, class, is an autograd Function) whose ``forward`` is patched.
MMCV_CPU_FP32_OPS = (
    ('mmcv.ops.nms', 'NMSop', True),
    ('mmcv.ops.nms', 'SoftNMSop', True),
    ('mmcv.ops.roi_align', 'RoIAlign', False),
    ('mmcv.ops.roi_pool', 'RoIPool', False),
)

_HALF = (torch.bfloat16, torch.float16)


def _half_dtype(args):
    for a in args:
        if (isinstance(a, torch.Tensor) and a.device.type == 'cpu'
                and a.dtype in _HALF):
            return a.dtype
    return None


def _back(value, dtype):
    if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
        return value.to(dtype)
    if isinstance(value, tuple):
        return tuple(_back(v, dtype) for v in value)
    return value


def _fp32(value):
    if (isinstance(value, torch.Tensor) and value.device.type == 'cpu'
            and value.dtype in _HALF):
        return value.float()
    return value


def install_fp32_mmcv_cpu_ops() -> list:
    """Patch the ops of :data:`MMCV_CPU_FP32_OPS` (once per process).

    Returns:
        list[str]: the ops patched by this call (empty when already done or
        when mmcv lacks them).
    """
    patched = []
    for module_name, name, is_function in MMCV_CPU_FP32_OPS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        function = getattr(module, name, None)
        if function is None or getattr(function, '_mmsafe_fp32_cpu', False):
            continue
        original = function.forward

        @functools.wraps(original)
        def forward(first, *args, _original=original, **kwargs):
            # `first` is the autograd ctx or the module.
            dtype = _half_dtype(args)
            if dtype is None:
                return _original(first, *args, **kwargs)
            args = tuple(_fp32(a) for a in args)
            kwargs = {k: _fp32(v) for k, v in kwargs.items()}
            with torch.autocast('cpu', enabled=False):
                return _back(_original(first, *args, **kwargs), dtype)

        function.forward = staticmethod(forward) if is_function else forward
        function._mmsafe_fp32_cpu = True
        patched.append(f'{module_name}.{name}')
    if patched:
        from mmsafe.events import log
        log('CPU autocast: mmcv ops '
            f"{', '.join(p.rsplit('.', 1)[1] for p in patched)} run in "
            'float32 (their CPU kernels take float32 only). Set '
            'optim_wrapper.fp32_mmcv_ops=False to turn this off.',
            logging.WARNING)
    return patched

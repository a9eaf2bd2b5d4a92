"""AMP (an AMP optim wrapper, or ``--amp``) and its dtype work on this device.

MMEngine's ``AmpOptimWrapper`` asserts a GPU (or NPU/MLU/MUSA) when it is
built, after the datasets are loaded; ``bfloat16`` needs a GPU that supports
it. mmsafe's ``AmpNaNSkipOptimWrapper`` runs AMP on CPU as well.
"""
from typing import Iterator, Optional

from ..context import PreflightContext
from ..report import CheckRow

NAME = 'amp'
VALID_DTYPES = ('float16', 'bfloat16', 'float32', 'float64')


def _accelerator() -> Optional[str]:
    import torch
    if torch.cuda.is_available():
        return 'cuda'
    try:
        from mmengine.device import (is_mlu_available, is_musa_available,
                                     is_npu_available)
        for name, probe in (('npu', is_npu_available),
                            ('mlu', is_mlu_available),
                            ('musa', is_musa_available)):
            if probe():
                return name
    except ImportError:
        pass
    return None


def _autocast_error(device: str, dtype: str) -> Optional[str]:
    """Run one tiny autocast matmul; the error text if it fails."""
    import torch
    if device == 'cuda' and dtype == 'bfloat16' and \
            not torch.cuda.is_bf16_supported():
        return 'this GPU does not support bfloat16'
    try:
        x = torch.ones(2, 2, device=device)
        with torch.autocast(device_type=device, dtype=getattr(torch, dtype)):
            (x @ x).sum().item()
    except Exception as err:
        return f'{type(err).__name__}: {err}'
    return None


def check_amp(ctx: PreflightContext) -> Iterator[CheckRow]:
    """An AMP optim wrapper can be built here, with its dtype."""
    optim = ctx.cfg.get('optim_wrapper', None) or {}
    type_name = optim.get('type', 'OptimWrapper')
    cls = ctx.lookup('OPTIM_WRAPPERS', type_name) if isinstance(
        type_name, str) else type_name
    try:
        from mmengine.optim import AmpOptimWrapper
    except ImportError:  # pragma: no cover
        AmpOptimWrapper = None
    name = type_name if isinstance(type_name, str) else getattr(
        type_name, '__name__', str(type_name))
    is_amp = name.split('.')[-1].startswith('Amp') or (
        isinstance(cls, type) and AmpOptimWrapper is not None
        and issubclass(cls, AmpOptimWrapper))
    if not is_amp:
        yield CheckRow('ok', NAME, f'AMP is off ({name}).',
                       'optim_wrapper.type')
        return
    device = _accelerator()
    needs_gpu = (isinstance(cls, type) and AmpOptimWrapper is not None
                 and issubclass(cls, AmpOptimWrapper)
                 and not cls.__module__.startswith('mmsafe'))
    if needs_gpu and device is None:
        yield CheckRow(
            'error', NAME, f'{name} needs a GPU (NPU/MLU/MUSA) and this '
            'machine has none: MMEngine asserts "AmpOptimizerWrapper is only '
            'available training on gpu" when the runner builds it.',
            'optim_wrapper.type',
            "Use optim_wrapper.type='AmpNaNSkipOptimWrapper' (mmsafe: CPU "
            'autocast + GradScaler, skips non-finite steps), or pass --amp '
            'to tools/train.py with type OptimWrapper/NaNSkipOptimWrapper, '
            'which picks it for you; or drop AMP on CPU.')
        return
    dtype = optim.get('dtype', None)
    if dtype is not None and not isinstance(dtype, str):
        dtype = str(dtype).replace('torch.', '')
    if dtype is not None and dtype not in VALID_DTYPES:
        yield CheckRow(
            'error', NAME, f'optim_wrapper.dtype={dtype!r} is not one of '
            f'{VALID_DTYPES}.', 'optim_wrapper.dtype',
            "Use 'float16' (GPU) or 'bfloat16', or leave it out.")
        return
    run_device = optim.get('device_type', None) or device or 'cpu'
    if run_device != 'cpu' and run_device != device:
        has = 'no accelerator' if device is None else device
        yield CheckRow(
            'error', NAME, f'optim_wrapper.device_type={run_device!r} but '
            f'this machine has {has}.', 'optim_wrapper.device_type',
            'Leave device_type out (CUDA when available, else CPU).')
        return
    probe = dtype or ('float16' if run_device == 'cuda' else 'bfloat16')
    problem = _autocast_error(run_device, probe)
    if problem:
        yield CheckRow(
            'error', NAME, f'Autocast with {probe} fails on {run_device}: '
            f'{problem}.', 'optim_wrapper.dtype',
            "Pick a dtype this device supports (CPU: 'bfloat16'; older "
            "GPUs: 'float16'), or turn AMP off.")
        return
    yield CheckRow('ok', NAME, f'AMP on: {name}, autocast {probe} works on '
                   f'{run_device}.', 'optim_wrapper.type')

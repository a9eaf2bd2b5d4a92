"""Name the cause of a failure of mmcv's CPU kernels under CPU autocast.

mmcv's CPU kernels of NMS, RoIAlign and RoIPool accept float32 only; under
``torch.autocast('cpu')`` the convolutions before them produce bfloat16 or
float16, and the kernel fails with a bare dtype message deep inside
MMDetection. mmsafe does not patch mmcv: a model that runs under CPU
autocast must call these ops on float32 tensors with autocast disabled
(``DualStreamFasterRCNN`` does so for its RPN and RoI heads).
"""
import os.path as osp
import traceback
from typing import Optional

import torch

#: Words of the kernels' dtype complaints ("expected scalar type Float but
#: found BFloat16", '"ROIAlign_forward" not implemented for 'BFloat16'').
_DTYPE_WORDS = ('BFloat16', 'Half', 'Float')
_MMCV_OPS_DIR = osp.join('mmcv', 'ops') + osp.sep


def mmcv_op_frame(exc: BaseException) -> Optional[traceback.FrameSummary]:
    """The innermost frame of ``exc``'s traceback inside ``mmcv/ops/`` when
    the exception is a dtype complaint, else None."""
    if not isinstance(exc, (RuntimeError, NotImplementedError)):
        return None
    if not any(word in str(exc) for word in _DTYPE_WORDS):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if _MMCV_OPS_DIR in frame.filename:
            return frame
    return None


def cpu_autocast_op_message(frame: traceback.FrameSummary,
                            exc: BaseException, dtype: torch.dtype) -> str:
    """What failed, where, and how to fix it."""
    op = osp.splitext(osp.basename(frame.filename))[0]
    return (
        f'[mmsafe] AmpNaNSkipOptimWrapper: under CPU autocast ({dtype}) the '
        f'mmcv op {op} ({frame.filename}:{frame.lineno}, in {frame.name}) '
        f'got half-precision tensors: {exc}. mmcv\'s CPU kernels (NMS, '
        'RoIAlign, RoIPool) take float32 only, and mmsafe does not patch '
        'them. Fix one of: use DualStreamFasterRCNN, which runs its RPN and '
        'RoI heads in float32 under CPU autocast; run your heads inside '
        "torch.autocast('cpu', enabled=False) on features cast with "
        ".float(); train in float32 on CPU (optim_wrapper.type="
        "'NaNSkipOptimWrapper', no --amp); or use AMP on CUDA.")

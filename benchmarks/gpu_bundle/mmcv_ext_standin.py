"""Stand-in for mmcv's compiled ``_ext`` on a machine without an mmcv build.

Only what the LLVIP recipe (Faster R-CNN) calls is implemented, through
torchvision's CUDA/CPU kernels: ``nms`` and ``roi_align_forward`` /
``roi_align_backward`` (average pooling). Every other op raises when called.
"""
import torch
import torchvision  # noqa: F401  (registers torch.ops.torchvision)
from torchvision.ops import nms as _tv_nms
from torchvision.ops import roi_align as _tv_roi_align


def get_compiler_version():
    return 'none (torchvision stand-in for mmcv._ext)'


def get_compiling_cuda_version():
    return str(torch.version.cuda)


def _compute_dtype(t):
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) \
        else t.dtype


def nms(boxes, scores, iou_threshold, offset):
    if boxes.numel() == 0:
        return boxes.new_zeros(0, dtype=torch.long)
    boxes = boxes.float()
    if offset:
        boxes = boxes.clone()
        boxes[:, 2:] += offset
    return _tv_nms(boxes, scores.float(), float(iou_threshold))


def roi_align_forward(input, rois, output, argmax_y, argmax_x,
                      aligned_height, aligned_width, spatial_scale,
                      sampling_ratio, pool_mode, aligned):
    if pool_mode != 1:
        raise NotImplementedError('stand-in _ext: roi_align max pooling')
    dt = _compute_dtype(input)
    out = _tv_roi_align(input.to(dt), rois.to(dt),
                        (aligned_height, aligned_width),
                        float(spatial_scale), int(sampling_ratio),
                        bool(aligned))
    output.copy_(out)


def roi_align_backward(grad_output, rois, argmax_y, argmax_x, grad_input,
                       aligned_height, aligned_width, spatial_scale,
                       sampling_ratio, pool_mode, aligned):
    if pool_mode != 1:
        raise NotImplementedError('stand-in _ext: roi_align max pooling')
    n, c, h, w = grad_input.shape
    dt = _compute_dtype(grad_output)
    grad = torch.ops.torchvision._roi_align_backward(
        grad_output.to(dt), rois.to(dt), float(spatial_scale),
        aligned_height, aligned_width, n, c, h, w, int(sampling_ratio),
        bool(aligned))
    grad_input.copy_(grad)


def __getattr__(name):
    if name.startswith('__'):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(
            f'stand-in mmcv._ext: {name} is not available on this machine')
    missing.__name__ = name
    return missing

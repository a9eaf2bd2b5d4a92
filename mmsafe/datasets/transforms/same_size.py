"""Resize and pack without the copies that change nothing.

After a reduced decode the image is already at the size the resize makes
(1280x1024 decoded at 1/2 is 640x512): OpenCV's resize to the source's own
size is a plain copy (``cv::resize`` returns ``src.copyTo(dst)`` when
``dsize == ssize``, whatever the interpolation). :class:`SameSizeResizeMixin`
skips that copy and keeps every field the resize writes exactly as it does
(``img_shape``, ``scale_factor`` ``(1.0, 1.0)``, ``keep_ratio``; boxes,
masks, segmentation maps and the homography are left to the resize itself).

:func:`chw_tensor` turns an ``H x W x C`` image into the ``C x H x W``
tensor :class:`mmdet.datasets.transforms.PackDetInputs` makes, with
OpenCV's channel split instead of a strided transpose; a flipped view
(``mmcv.imflip`` returns ``np.flip`` views) is split from the array under
it and its planes flipped in place by OpenCV.

Invariant: the pixels, dtype, shape and C-contiguity of every output are
those of the general path (tested against it); only arrays that OpenCV
handles exactly take the short path, the others the general one.
"""
from typing import Optional

import cv2
import mmcv
import numpy as np
import torch

from mmsafe.compat import numpy_to_tensor

#: dtypes that ``cv2.resize``, ``cv2.split`` and ``cv2.flip`` take as they
#: are (no conversion)
CV2_DTYPES = frozenset(
    np.dtype(t) for t in (np.uint8, np.uint16, np.int16, np.float32,
                          np.float64))


def _cv2_exact(img: np.ndarray) -> bool:
    """Whether OpenCV maps ``img`` to a Mat of the same shape (2-D, or 3-D
    with 2 to 4 channels: one channel would come back 2-D) and dtype."""
    return img.dtype in CV2_DTYPES and (
        img.ndim == 2 or (img.ndim == 3 and 2 <= img.shape[2] <= 4))


def resize_keeps_image(img: np.ndarray, scale, keep_ratio: bool,
                       backend: Optional[str]) -> bool:
    """Whether ``mmcv.imresize`` (``imrescale`` with ``keep_ratio``) of
    ``img`` to ``scale`` with ``backend`` would return an exact, C-contiguous
    copy of ``img``: the cv2 backend, a target size equal to the image size
    and an array OpenCV takes as it is."""
    if backend != 'cv2' or not img.flags.c_contiguous or not _cv2_exact(img):
        return False
    h, w = img.shape[:2]
    if keep_ratio:
        size = mmcv.rescale_size((w, h), scale)
    else:
        size = scale
    return (isinstance(size, (tuple, list)) and len(size) == 2
            and all(type(s) is int for s in size)
            and (size[0], size[1]) == (w, h))


class SameSizeResizeMixin:
    """For :class:`mmcv.transforms.Resize` subclasses (mmdet's ``Resize``):
    a resize to the image's own size keeps the image array instead of
    letting OpenCV copy it. Put it before the resize in the bases."""

    def _resize_img(self, results: dict) -> None:
        img = results.get('img')
        if img is not None and resize_keeps_image(
                img, results['scale'], self.keep_ratio, self.backend):
            # what Resize._resize_img writes: new size / old size = 1.0
            results['img_shape'] = img.shape[:2]
            results['scale_factor'] = (1.0, 1.0)
            results['keep_ratio'] = self.keep_ratio
            return
        super()._resize_img(results)


def _unflipped(img: np.ndarray):
    """``(base, flip_code)`` when ``img`` is a C-contiguous array seen
    through ``np.flip`` (``cv2.flip(base, flip_code)`` equals ``img``), else
    None."""
    if img.ndim < 2:
        return None
    flip_w, flip_h = img.strides[1] < 0, img.strides[0] < 0
    if not (flip_w or flip_h):
        return None
    base = img[:, ::-1] if flip_w else img
    base = base[::-1] if flip_h else base
    if not base.flags.c_contiguous:
        return None
    code = -1 if flip_w and flip_h else (1 if flip_w else 0)
    return base, code


def _split_planes(img: np.ndarray) -> Optional[np.ndarray]:
    """``img`` (H x W x C, 2 <= C <= 4) as a C-contiguous C x H x W array
    via OpenCV, or None when OpenCV would not give it exactly."""
    if img.ndim != 3 or not _cv2_exact(img) or img.size == 0:
        return None
    code = None
    if not img.flags.c_contiguous:
        flipped = _unflipped(img)
        if flipped is None:
            return None
        img, code = flipped  # split the unflipped array, flip the planes
    h, w, c = img.shape
    chw = np.empty((c, h, w), img.dtype)
    planes = list(chw)
    # OpenCV writes into the arrays given for its outputs when they have
    # the output's size and type (and returns them), else it allocates
    got = cv2.split(img, planes)
    if len(got) != c or any(g is not p for g, p in zip(got, planes)):
        return None
    if code is not None:
        for plane in planes:
            if cv2.flip(plane, code, plane) is not plane:
                return None
    return chw


def chw_tensor(img: np.ndarray) -> torch.Tensor:
    """``H x W (x C)`` array -> contiguous ``C x H x W`` tensor, dtype kept:
    what ``PackDetInputs`` packs as ``inputs``, element for element. On a
    torch without uint16 tensors a uint16 image becomes int32 (every value
    exact; see :func:`mmsafe.compat.numpy_to_tensor`)."""
    if img.ndim < 3:
        img = np.expand_dims(img, -1)
    chw = _split_planes(img)
    if chw is not None:
        return numpy_to_tensor(chw)
    # PackDetInputs' own conversion
    if not img.flags.c_contiguous:
        return numpy_to_tensor(np.ascontiguousarray(img.transpose(2, 0, 1)))
    return numpy_to_tensor(img).permute(2, 0, 1).contiguous()

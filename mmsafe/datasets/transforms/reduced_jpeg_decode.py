"""Decode a JPEG at 1/2, 1/4 or 1/8 of its size (libjpeg's DCT scaling,
OpenCV's ``IMREAD_REDUCED_*`` modes) when the pipeline resizes it down
anyway, and keep the bookkeeping of a full decode.

The reduction is chosen from the size the following resize produces
(``scale`` and ``keep_ratio`` as in ``Resize``): the largest of 2, 4, 8
whose decoded size is still at least that size in both dimensions, so the
resize never enlarges. Files that cannot be decoded reduced (PNG, BMP,
TIFF, 16-bit images) are decoded in full (said once per process and
format).

Bookkeeping between the decode and the first resize (invariants):

* ``ori_shape`` is the file's real size (read from its header),
  ``img_shape`` the decoded size, ``scale_factor`` the decode's scale and
  ``homography_matrix`` / ``ir_homography_matrix`` the decode's scaling,
  so the decode is a step of each modality's geometry record;
* ``instances`` are in the decoded frame (their original values are kept
  under :data:`ORI_INSTANCES_KEY`), so that ``LoadAnnotations`` there gives
  boxes of the image it sits beside, as it does after a full decode.

The first paired resize folds the decode in (:func:`fold_decode`): its
``scale_factor`` is multiplied by the decode's and ``instances`` return to
the original frame. From there on the results are those of a full decode
followed by that resize, so predictions rescaled by ``scale_factor`` and
ground truth loaded after the resize are in the original frame.
"""
import logging
import math
from io import BytesIO
from typing import Any, Iterable, Optional, Sequence, Tuple

import cv2
import mmcv
import numpy as np

from mmsafe.errors import MMSafeValueError
from mmsafe.events import log

#: results key: (w, h) scale of a reduced decode not yet folded into a resize
DECODE_KEY = 'decode_scale_factor'
#: results key: ``instances`` in the original frame while a decode is pending
ORI_INSTANCES_KEY = 'ori_instances'
REDUCTIONS = (8, 4, 2)

_REDUCED_FLAGS = {
    'color': {
        2: cv2.IMREAD_REDUCED_COLOR_2,
        4: cv2.IMREAD_REDUCED_COLOR_4,
        8: cv2.IMREAD_REDUCED_COLOR_8
    },
    'grayscale': {
        2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
        4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
        8: cv2.IMREAD_REDUCED_GRAYSCALE_8
    },
}
_JPEG_MAGIC = b'\xff\xd8\xff'
_fallback_logged = set()


def check_reduced_decode_cfg(cfg: Optional[dict], owner: str,
                             color_types: Iterable[str],
                             imdecode_backend: str) -> Optional[dict]:
    """Validate a ``reduced_decode`` option; return it normalised.

    Args:
        cfg (dict | None): ``dict(scale=(w, h), keep_ratio=True,
            max_reduction=8)``; None: off.
        owner (str): the transform, named in the errors.
        color_types (Iterable[str]): the ``color_type`` flags it decodes
            with.
        imdecode_backend (str): the loader's decode backend.
    """
    if cfg is None:
        return None
    if not isinstance(cfg, dict) or 'scale' not in cfg:
        raise MMSafeValueError(
            f'{owner}: reduced_decode must be None or dict(scale=(w, h), '
            f'keep_ratio=True, max_reduction=8), got {cfg!r}')
    unknown = set(cfg) - {'scale', 'keep_ratio', 'max_reduction'}
    if unknown:
        raise MMSafeValueError(f'{owner}: unknown reduced_decode keys '
                               f'{sorted(unknown)}')
    scale = cfg['scale']
    if not (isinstance(scale, (tuple, list)) and len(scale) == 2
            and all(int(s) > 0 for s in scale)):
        raise MMSafeValueError(f'{owner}: reduced_decode scale must be (w, h) '
                               f'of the following resize, got {scale!r}')
    max_reduction = int(cfg.get('max_reduction', 8))
    if max_reduction not in (1, 2, 4, 8):
        raise MMSafeValueError(
            f'{owner}: reduced_decode max_reduction must be 1, '
            f'2, 4 or 8, got {max_reduction}')
    if imdecode_backend != 'cv2':
        raise MMSafeValueError(
            f'{owner}: reduced_decode needs imdecode_backend=\'cv2\' '
            f'(OpenCV\'s reduced JPEG modes), got {imdecode_backend!r}')
    for color_type in color_types:
        if color_type not in _REDUCED_FLAGS:
            raise MMSafeValueError(
                f'{owner}: reduced_decode decodes color_type \'color\' or '
                f'\'grayscale\', got {color_type!r}; turn it off for this '
                'color type')
    return dict(scale=(int(scale[0]), int(scale[1])),
                keep_ratio=bool(cfg.get('keep_ratio', True)),
                max_reduction=max_reduction)


#: JPEG start-of-frame markers (SOF0-SOF15 less DHT, JPG and DAC): the
#: frame header holding the image's size
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: markers without a length field (TEM, RST0-RST7, SOI)
_STANDALONE_MARKERS = frozenset(range(0xD0, 0xD9)) | {0x01}


def jpeg_frame_size(img_bytes: bytes) -> Optional[Tuple[int, int]]:
    """(w, h) from a JPEG's frame header (SOFn), walking the marker segments
    before it; None when the bytes are no JPEG or the walk does not reach a
    frame header with a size (e.g. a height defined later by DNL)."""
    if img_bytes[:3] != _JPEG_MAGIC:
        return None
    n = len(img_bytes)
    i = 2
    while i + 4 <= n:
        if img_bytes[i] != 0xFF:
            return None
        marker = img_bytes[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _STANDALONE_MARKERS:
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan
            return None
        if marker in _SOF_MARKERS:
            if i + 9 > n:
                return None
            h = (img_bytes[i + 5] << 8) | img_bytes[i + 6]
            w = (img_bytes[i + 7] << 8) | img_bytes[i + 8]
            return (w, h) if w > 0 and h > 0 else None
        i += 2 + ((img_bytes[i + 2] << 8) | img_bytes[i + 3])
    return None


def image_size(img_bytes: bytes) -> Tuple[int, int]:
    """(w, h) of an encoded image from its header (nothing is decoded): a
    JPEG's frame header, else what PIL reads."""
    size = jpeg_frame_size(img_bytes)
    if size is not None:
        return size
    from PIL import Image
    with Image.open(BytesIO(img_bytes)) as im:
        return im.size


def choose_reduction(size: Sequence[int], cfg: dict) -> int:
    """The largest reduction (1, 2, 4 or 8) of an image of ``size`` (w, h)
    whose decoded size is at least what the resize of ``cfg`` makes of the
    full image."""
    w, h = int(size[0]), int(size[1])
    if cfg['keep_ratio']:
        out_w, out_h = mmcv.rescale_size((w, h), cfg['scale'])
    else:
        out_w, out_h = cfg['scale']
    for d in REDUCTIONS:
        if d <= cfg['max_reduction'] and math.ceil(w / d) >= out_w and \
                math.ceil(h / d) >= out_h:
            return d
    return 1


def pair_reduction(sizes: Sequence[Sequence[int]], cfg: dict) -> int:
    """One reduction for the images of a pair, ``sizes`` (w, h) each: the
    largest that every one of them allows, so both decode to one size."""
    return min(choose_reduction(size, cfg) for size in sizes)


def _reducible(img_bytes: bytes) -> Optional[str]:
    """None when the bytes are an 8-bit JPEG, else the format's name."""
    if img_bytes[:3] != _JPEG_MAGIC:
        from PIL import Image
        try:
            with Image.open(BytesIO(img_bytes)) as im:
                return im.format or 'unknown format'
        except Exception:  # the full decode reports unreadable files
            return 'unknown format'
    return None


def decode(img_bytes: bytes, color_type: str, reduction: int, owner: str,
           path: str,
           backend: str = 'cv2') -> Tuple[Optional[np.ndarray], int]:
    """Decode at ``1/reduction`` when the file allows it, else in full with
    ``mmcv.imfrombytes`` and ``backend`` (a reduction above 1 needs 'cv2',
    which :func:`check_reduced_decode_cfg` demands).

    Returns:
        tuple: the image (None when undecodable) and the reduction used.
    """
    if reduction > 1:
        fmt = _reducible(img_bytes)
        if fmt is not None:
            if fmt not in _fallback_logged:
                _fallback_logged.add(fmt)
                log(f'{owner}: reduced_decode: {fmt} images cannot be '
                    f'decoded reduced; decoding them in full (first: '
                    f'{path}). Said once per process.', logging.WARNING)
            reduction = 1
    if reduction == 1:
        return mmcv.imfrombytes(img_bytes, flag=color_type,
                                backend=backend), 1
    buf = np.frombuffer(img_bytes, np.uint8)
    return cv2.imdecode(buf, _REDUCED_FLAGS[color_type][reduction]), \
        reduction


def decoded_scale(ori_size: Sequence[int], img: np.ndarray, reduction: int,
                  owner: str, path: str) -> Tuple[float, float]:
    """(w, h) scale of a decode; checks the decoded size is libjpeg's
    ``ceil(size / reduction)``."""
    w, h = int(ori_size[0]), int(ori_size[1])
    expected = (math.ceil(h / reduction), math.ceil(w / reduction))
    if img.shape[:2] != expected:
        raise MMSafeValueError(
            f'{owner}: {path} decoded to {img.shape[:2]} (h, w) at 1/'
            f'{reduction}, but its header says {w}x{h} (expected '
            f'{expected}); an EXIF orientation may rotate it. Turn '
            'reduced_decode off for this dataset.')
    return img.shape[1] / w, img.shape[0] / h


def scale_instances(results: dict, scale: Tuple[float, float]) -> None:
    """Put ``results['instances']`` in the decoded frame (originals kept
    under :data:`ORI_INSTANCES_KEY`)."""
    instances = results.get('instances')
    if not instances:
        return
    results[ORI_INSTANCES_KEY] = instances
    sx, sy = scale
    scaled = []
    for instance in instances:
        instance = dict(instance)
        if instance.get('bbox') is not None:
            x1, y1, x2, y2 = instance['bbox']
            instance['bbox'] = [x1 * sx, y1 * sy, x2 * sx, y2 * sy]
        if instance.get('mask') is not None:
            raise MMSafeValueError(
                'reduced_decode does not scale masks (sample '
                f'{results.get("img_path")}); turn it off for mask '
                'annotations')
        scaled.append(instance)
    results['instances'] = scaled


def pending_decode(results: dict) -> Optional[Any]:
    """Before a paired geometric step: when a reduced decode is pending,
    take ``scale_factor`` out (so that the step shows whether it resizes)
    and return it wrapped in a 1-tuple; else None."""
    if results.get(DECODE_KEY) is None:
        return None
    return (results.pop('scale_factor', None), )


def fold_decode(results: dict, pending: Optional[Any]) -> None:
    """After a paired geometric step: when it resized, fold the pending
    decode into it (``scale_factor`` from the original size, ``instances``
    back in the original frame); else put ``scale_factor`` back."""
    if pending is None:
        return
    if 'scale_factor' not in results:
        results['scale_factor'] = pending[0]
        return
    dx, dy = results.pop(DECODE_KEY)
    sx, sy = results['scale_factor']
    results['scale_factor'] = (sx * dx, sy * dy)
    if ORI_INSTANCES_KEY in results:
        results['instances'] = results.pop(ORI_INSTANCES_KEY)

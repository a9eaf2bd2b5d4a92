"""Load a visible image and its infrared partner."""
import logging
from typing import Any, Optional

import cv2
import mmcv
import numpy as np
from mmcv.transforms import LoadImageFromFile
from mmengine import fileio

from mmsafe.registry import TRANSFORMS
from mmsafe.errors import MMSafeKeyError, MMSafeOSError, MMSafeValueError
from mmsafe.events import log
from .bit_depth import (BIT_DEPTH_KEY, check_high_depth_cfg, file_bit_depth,
                        normalise, read_high_depth, refusal)
from .geometry_record import BOTH, INFRARED_KEY, VISIBLE_KEY, log_step
from .reduced_jpeg_decode import (DECODE_KEY, check_reduced_decode_cfg,
                                  decode, decoded_scale, image_size,
                                  pair_reduction, scale_instances)

SIZE_MISMATCH_POLICIES = ('error', 'resize')
#: dtypes whose grey -> 3-channel conversion OpenCV copies bit for bit
_CV2_GREY_DTYPES = frozenset(
    np.dtype(t) for t in (np.uint8, np.uint16, np.float32))


def three_channels(img: np.ndarray) -> np.ndarray:
    """An ``H x W`` image as ``H x W x 3``, its channel repeated (what
    ``np.repeat(img[..., None], 3, axis=2)`` gives; OpenCV's copy where it
    is exact, a fraction of numpy's time)."""
    if img.dtype in _CV2_GREY_DTYPES and img.flags.c_contiguous and \
            img.size > 0:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    return np.repeat(img[..., None], 3, axis=2)


@TRANSFORMS.register_module()
class LoadPairedImageFromFile(LoadImageFromFile):
    """Load ``img_path`` into ``img`` (visible) and ``ir_img_path`` into
    ``ir_img`` (infrared, always H x W x 3: a single-channel file is repeated
    into three channels).

    Required Keys: img_path, ir_img_path

    Added Keys: img, ir_img, img_shape, ori_shape, ir_ori_shape; with a
    reduced decode also scale_factor, homography_matrix,
    ir_homography_matrix, pair_geometry_log, decode_scale_factor; for a
    file of more than 8 bits per channel bit_depth

    Each file's depth is read from its header first: an 8-bit file is
    decoded as ``color_type`` says; a deeper one (a 16-bit radiometric
    thermal PNG or TIFF) with its full depth, then mapped to 0-255 by the
    ``high_depth`` rule, or refused with an error that names the rules;
    never cut to its high byte (see :mod:`.bit_depth`).

    A missing or unreadable file raises an error that names both paths of the
    pair; a sample without ``ir_img_path`` (an unpaired dataset) is an error,
    never a silent visible-only sample.

    Args:
        ir_color_type (str): ``mmcv.imfrombytes`` flag for the infrared image.
            Defaults to ``'color'`` (LLVIP stores infrared as 3-channel jpg).
            ``'grayscale'`` decodes the luma only, repeated into 3 channels:
            the colour decode's pixels for a grey JPEG (neutral chroma),
            without its chroma work.
        on_size_mismatch (str): ``'error'`` (default) when the two images
            differ in size, or ``'resize'`` to resize infrared to the
            visible size (bilinear; logged once).
        reduced_decode (dict, optional): decode JPEGs at 1/2, 1/4 or 1/8
            of their size for the resize that follows, e.g.
            ``dict(scale=(640, 512), keep_ratio=True)`` (the resize's own
            ``scale`` and ``keep_ratio``; ``max_reduction`` caps the
            reduction). One reduction for both modalities: the largest
            whose decoded size is at least the resize's output. A paired
            resize must follow (it folds the decode into ``scale_factor``);
            see :mod:`.reduced_jpeg_decode` for the bookkeeping. Defaults to
            None (full decode).
        high_depth (dict, optional): how an image of more than 8 bits per
            channel keeps its depth: ``dict(rule='percentile', low=1,
            high=99)``, ``dict(rule='minmax')``, ``dict(rule='fixed',
            low=..., high=...)`` (to 0-255, float32) or
            ``dict(rule='raw')`` (the counts, float32); recorded in the
            results' ``bit_depth``. None (default): such an image is an
            error naming these rules, except with ``'unchanged'`` colour
            types, which read it as ``'raw'`` (said once).
        **kwargs: :class:`mmcv.transforms.LoadImageFromFile` arguments
            (``to_float32``, ``color_type``, ``imdecode_backend``,
            ``ignore_empty``, ``backend_args``). With ``ignore_empty=True``
            an unreadable pair returns None (the dataset then picks another
            sample in training).
    """

    pair_aware = True

    def __init__(self,
                 ir_color_type: str = 'color',
                 on_size_mismatch: str = 'error',
                 reduced_decode: Optional[dict] = None,
                 high_depth: Optional[dict] = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.high_depth = check_high_depth_cfg(high_depth,
                                               type(self).__name__)
        self._raw_said = False
        self.reduced_decode = check_reduced_decode_cfg(
            reduced_decode, type(self).__name__,
            (self.color_type, ir_color_type), self.imdecode_backend)
        if on_size_mismatch not in SIZE_MISMATCH_POLICIES:
            raise MMSafeValueError(f'on_size_mismatch must be one of '
                                   f'{SIZE_MISMATCH_POLICIES}, got '
                                   f'{on_size_mismatch!r}')
        self.ir_color_type = ir_color_type
        self.on_size_mismatch = on_size_mismatch
        self._resize_logged = False

    def _guarded(self, what: str, path: str, which: str, pair: str, fn,
                 *args) -> Any:
        """``fn(*args)``; a failure is None with ``ignore_empty``, else an
        OSError naming the file and its pair."""
        try:
            return fn(*args)
        except Exception as e:
            if self.ignore_empty:
                return None
            raise MMSafeOSError(
                f'LoadPairedImageFromFile: cannot read {what} '
                f'{which} image {path} ({type(e).__name__}: {e}); '
                f'pair: {pair}') from e

    def _get(self, path: str, which: str, pair: str) -> Optional[bytes]:
        return self._guarded(
            'the', path, which, pair,
            lambda: fileio.get(path, backend_args=self.backend_args))

    def _decode(self, img_bytes: bytes, path: str, flag: str, which: str,
                pair: str, reduction: int) -> Optional[tuple]:
        """``(image, reduction used)``, or None with ``ignore_empty``."""

        def decode_image():
            img, used = decode(img_bytes, flag, reduction,
                               type(self).__name__, path,
                               self.imdecode_backend)
            if img is None:
                raise MMSafeValueError(
                    'the file could not be decoded as an image')
            return img, used

        return self._guarded('the', path, which, pair, decode_image)

    def _load(self, results: dict, img_bytes: bytes, path: str, flag: str,
              which: str, pair: str, reduction: int) -> Optional[tuple]:
        """``(image, reduction used)`` of a file of any depth (see the
        class docstring), or None with ``ignore_empty``."""
        bits = file_bit_depth(img_bytes)
        if bits <= 8:
            return self._decode(img_bytes, path, flag, which, pair,
                                reduction)

        def decode_deep():
            img = read_high_depth(img_bytes, flag)
            if img is None:
                raise MMSafeValueError(
                    'the file could not be decoded as an image')
            return img

        img = self._guarded('the', path, which, pair, decode_deep)
        if img is None:
            return None
        rule = self.high_depth
        owner = type(self).__name__
        if rule is None and flag.startswith('unchanged'):
            rule = dict(rule='raw')
            if not self._raw_said:
                self._raw_said = True
                log(f'{owner}: the {which} image {path} has {bits} bits per '
                    f"channel and color_type {flag!r}: its counts are kept "
                    "as float32 (high_depth=dict(rule='raw')); the "
                    "preprocessor's mean/std must be in counts "
                    '(tools/check_dataset.py CONFIG --stats prints them). '
                    'Said once per loading process.', logging.WARNING)
        if rule is None:
            raise MMSafeValueError(refusal(owner, which, path, bits, img))
        record = dict(bits=bits, min=float(img.min()), max=float(img.max()))
        img, done = normalise(img, rule)
        if flag.startswith('color') and img.ndim == 2:
            img = three_channels(img)
        record.update(done)
        results.setdefault(BIT_DEPTH_KEY, {})[which] = record
        return img, 1

    def _size(self, img_bytes: bytes, path: str, which: str,
              pair: str) -> Optional[tuple]:
        return self._guarded('the size of the', path, which, pair,
                             image_size, img_bytes)

    def transform(self, results: dict) -> Optional[dict]:
        """Load both images of the pair.

        Args:
            results (dict): a data info with ``img_path`` and
                ``ir_img_path``.

        Returns:
            dict | None: results with ``img`` and ``ir_img``.
        """
        img_path = results['img_path']
        ir_path = results.get('ir_img_path')
        if ir_path is None:
            raise MMSafeKeyError(
                f'LoadPairedImageFromFile: sample {img_path} has no '
                "'ir_img_path': the dataset is not paired. Use LLVIPDataset "
                'with return_modality_pair=True or wrap the dataset in '
                'PairedModalityDataset.')
        pair = f'visible={img_path} | infrared={ir_path}'
        img_bytes = self._get(img_path, 'visible', pair)
        ir_bytes = self._get(ir_path, 'infrared', pair)
        if img_bytes is None or ir_bytes is None:
            return None
        reduction = vis_size = ir_size = None
        if self.reduced_decode is not None:
            vis_size = self._size(img_bytes, img_path, 'visible', pair)
            ir_size = self._size(ir_bytes, ir_path, 'infrared', pair)
            if vis_size is None or ir_size is None:
                return None
            reduction = pair_reduction((vis_size, ir_size),
                                       self.reduced_decode)
        results.pop(BIT_DEPTH_KEY, None)
        vis = self._load(results, img_bytes, img_path, self.color_type,
                         'visible', pair, reduction or 1)
        ir = self._load(results, ir_bytes, ir_path, self.ir_color_type,
                        'infrared', pair, reduction or 1)
        if vis is None or ir is None:
            return None
        (img, vis_red), (ir_img, ir_red) = vis, ir
        if ir_img.ndim == 2:
            ir_img = three_channels(ir_img)
        if reduction is None:
            ori_shape = img.shape[:2]
            results['ir_ori_shape'] = ir_img.shape[:2]
        else:
            vis_scale = decoded_scale(vis_size, img, vis_red,
                                      type(self).__name__, img_path)
            decoded_scale(ir_size, ir_img, ir_red, type(self).__name__,
                          ir_path)
            ori_shape = (vis_size[1], vis_size[0])
            results['ir_ori_shape'] = (ir_size[1], ir_size[0])
        if ir_img.shape[:2] != img.shape[:2]:
            if self.on_size_mismatch == 'error':
                decoded = '' if reduction is None else (
                    f', decoded at 1/{vis_red} (visible) and 1/{ir_red} '
                    f'(infrared) from files of {ori_shape} and '
                    f'{results["ir_ori_shape"]}')
                raise MMSafeValueError(
                    'LoadPairedImageFromFile: visible and infrared sizes '
                    f'differ (visible {img.shape[:2]}, infrared '
                    f'{ir_img.shape[:2]}, as (h, w){decoded}); pair: '
                    f'{pair}. The '
                    "pair must be registered; set on_size_mismatch='resize' "
                    'only if both cover the same field of view.')
            if not self._resize_logged:
                log(f'LoadPairedImageFromFile: resizing infrared to the '
                    f'visible size (first: {ir_img.shape[:2]} -> '
                    f'{img.shape[:2]}, {pair}); on_size_mismatch=\'error\' '
                    'turns this off', logging.WARNING)
                self._resize_logged = True
            ir_img = mmcv.imresize(ir_img, (img.shape[1], img.shape[0]))
        if reduction is not None and (vis_red > 1 or ir_red > 1):
            self._record_decode(results, vis_scale, ir_size, img,
                                (vis_red, ir_red))
        if self.to_float32:
            img = img.astype(np.float32)
            ir_img = ir_img.astype(np.float32)
        results['img'] = img
        results['ir_img'] = ir_img
        results['img_shape'] = img.shape[:2]
        results['ori_shape'] = ori_shape
        return results

    def _record_decode(self, results: dict, vis_scale: tuple,
                       ir_size: tuple, img: np.ndarray,
                       reductions: tuple) -> None:
        """The decode as the first step of each modality's geometry (the
        infrared one from its own file size to the pair's decoded size),
        ``scale_factor`` and the instances in the decoded frame."""
        h, w = img.shape[:2]
        ir_scale = (w / ir_size[0], h / ir_size[1])
        results[VISIBLE_KEY] = np.diag([vis_scale[0], vis_scale[1],
                                        1.0]).astype(np.float32)
        results[INFRARED_KEY] = np.diag([ir_scale[0], ir_scale[1], 1.0])
        vis, ir = (f'1/{r}' if r > 1 else 'full' for r in reductions)
        log_step(results, f'{type(self).__name__} (decode visible {vis}, '
                 f'infrared {ir})', BOTH)
        results['scale_factor'] = vis_scale
        results[DECODE_KEY] = vis_scale
        scale_instances(results, vis_scale)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(color_type={self.color_type!r}, '
                f'ir_color_type={self.ir_color_type!r}, '
                f'on_size_mismatch={self.on_size_mismatch!r}, '
                f'reduced_decode={self.reduced_decode!r}, '
                f'high_depth={self.high_depth!r}, '
                f'to_float32={self.to_float32}, '
                f'ignore_empty={self.ignore_empty})')

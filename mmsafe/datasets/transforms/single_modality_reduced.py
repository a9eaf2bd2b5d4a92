"""Reduced JPEG decoding for single-modality pipelines: a loader and the
resize that folds the decode into ``scale_factor`` (see
:mod:`.reduced_jpeg_decode` for the bookkeeping)."""
from typing import Optional

import numpy as np
from mmcv.transforms import LoadImageFromFile
from mmengine import fileio

from mmdet.datasets.transforms import Resize
from mmsafe.registry import TRANSFORMS
from mmsafe.errors import MMSafeOSError, MMSafeValueError
from .geometry_record import VISIBLE_KEY, log_step
from .reduced_jpeg_decode import (DECODE_KEY, check_reduced_decode_cfg,
                                  choose_reduction, decode, decoded_scale,
                                  fold_decode, image_size, pending_decode,
                                  scale_instances)
from .same_size import SameSizeResizeMixin


@TRANSFORMS.register_module()
class LoadImageFromFileReduced(LoadImageFromFile):
    """:class:`mmcv.transforms.LoadImageFromFile` that decodes a JPEG at
    1/2, 1/4 or 1/8 of its size for the resize that follows (the largest
    reduction whose size is at least that resize's output).

    ``ori_shape`` is the file's size (from its header), ``img_shape`` the
    decoded size; ``scale_factor``, ``homography_matrix`` and the
    ``instances`` are those of the decode until a :class:`DecodeAwareResize`
    (or a paired resize) folds it in. Non-JPEG files are decoded in full
    (said once per process and format).

    Args:
        reduced_decode (dict): ``dict(scale=(w, h), keep_ratio=True,
            max_reduction=8)``, the following resize's ``scale`` and
            ``keep_ratio``.
        **kwargs: :class:`mmcv.transforms.LoadImageFromFile` arguments
            (``imdecode_backend`` must be ``'cv2'``).
    """

    def __init__(self, reduced_decode: dict, **kwargs) -> None:
        super().__init__(**kwargs)
        self.reduced_decode = check_reduced_decode_cfg(
            reduced_decode, type(self).__name__, (self.color_type, ),
            self.imdecode_backend)

    def transform(self, results: dict) -> Optional[dict]:
        """Load ``img_path`` reduced.

        Args:
            results (dict): a data info with ``img_path``.

        Returns:
            dict | None: results with ``img`` (None when unreadable and
            ``ignore_empty``).
        """
        path = results['img_path']
        try:
            img_bytes = fileio.get(path, backend_args=self.backend_args)
            size = image_size(img_bytes)
            img, reduction = decode(
                img_bytes, self.color_type,
                choose_reduction(size, self.reduced_decode),
                type(self).__name__, path)
            if img is None:
                raise MMSafeValueError(
                    'the file could not be decoded as an image')
        except Exception as e:
            if self.ignore_empty:
                return None
            raise MMSafeOSError(f'{type(self).__name__}: cannot read {path} '
                                f'({type(e).__name__}: {e})') from e
        scale = decoded_scale(size, img, reduction, type(self).__name__,
                              path)
        if self.to_float32:
            img = img.astype(np.float32)
        results['img'] = img
        results['img_shape'] = img.shape[:2]
        results['ori_shape'] = (size[1], size[0])
        if reduction > 1:
            results[VISIBLE_KEY] = np.diag([scale[0], scale[1],
                                            1.0]).astype(np.float32)
            log_step(results, f'{type(self).__name__} (decode '
                     f'1/{reduction})', 'visible')
            results['scale_factor'] = scale
            results[DECODE_KEY] = scale
            scale_instances(results, scale)
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(color_type={self.color_type!r}, '
                f'reduced_decode={self.reduced_decode!r}, '
                f'to_float32={self.to_float32}, '
                f'ignore_empty={self.ignore_empty})')


@TRANSFORMS.register_module()
class DecodeAwareResize(SameSizeResizeMixin, Resize):
    """:class:`mmdet.datasets.transforms.Resize` that folds a pending
    reduced decode (:class:`LoadImageFromFileReduced`) into
    ``scale_factor`` (from the file's size) and puts ``instances`` back in
    the file's frame; without a pending decode it is ``Resize``. A resize
    to the image's own size keeps the array (see :mod:`.same_size`)."""

    def transform(self, results: dict) -> dict:
        """Resize, then fold the decode in."""
        pending = pending_decode(results)
        results = super().transform(results)
        fold_decode(results, pending)
        return results

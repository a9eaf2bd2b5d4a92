"""Load a visible image and its infrared partner."""
import logging
from typing import Optional

import mmcv
import numpy as np
from mmcv.transforms import LoadImageFromFile
from mmengine import fileio

from mmdet.registry import TRANSFORMS
from mmsafe.events import log

SIZE_MISMATCH_POLICIES = ('error', 'resize')


@TRANSFORMS.register_module()
class LoadPairedImageFromFile(LoadImageFromFile):
    """Load ``img_path`` into ``img`` (visible) and ``ir_img_path`` into
    ``ir_img`` (infrared, always H x W x 3: a single-channel file is repeated
    into three channels).

    Required Keys: img_path, ir_img_path

    Added Keys: img, ir_img, img_shape, ori_shape, ir_ori_shape

    A missing or unreadable file raises an error that names both paths of the
    pair; a sample without ``ir_img_path`` (an unpaired dataset) is an error,
    never a silent visible-only sample.

    Args:
        ir_color_type (str): ``mmcv.imfrombytes`` flag for the infrared image.
            Defaults to ``'color'`` (LLVIP stores infrared as 3-channel jpg).
        on_size_mismatch (str): ``'error'`` (default) when the two images
            differ in size, or ``'resize'`` to resize infrared to the
            visible size (bilinear; logged once).
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
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if on_size_mismatch not in SIZE_MISMATCH_POLICIES:
            raise ValueError(f'on_size_mismatch must be one of '
                             f'{SIZE_MISMATCH_POLICIES}, got '
                             f'{on_size_mismatch!r}')
        self.ir_color_type = ir_color_type
        self.on_size_mismatch = on_size_mismatch
        self._resize_logged = False

    def _read(self, path: str, flag: str, which: str,
              pair: str) -> Optional[np.ndarray]:
        try:
            img_bytes = fileio.get(path, backend_args=self.backend_args)
            img = mmcv.imfrombytes(
                img_bytes, flag=flag, backend=self.imdecode_backend)
            if img is None:
                raise ValueError('the file could not be decoded as an image')
        except Exception as e:
            if self.ignore_empty:
                return None
            raise OSError(f'LoadPairedImageFromFile: cannot read the {which} '
                          f'image {path} ({type(e).__name__}: {e}); '
                          f'pair: {pair}') from e
        return img

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
            raise KeyError(
                f'LoadPairedImageFromFile: sample {img_path} has no '
                "'ir_img_path': the dataset is not paired. Use LLVIPDataset "
                'with return_modality_pair=True or wrap the dataset in '
                'PairedModalityDataset.')
        pair = f'visible={img_path} | infrared={ir_path}'
        img = self._read(img_path, self.color_type, 'visible', pair)
        ir_img = self._read(ir_path, self.ir_color_type, 'infrared', pair)
        if img is None or ir_img is None:
            return None
        if ir_img.ndim == 2:
            ir_img = np.repeat(ir_img[..., None], 3, axis=2)
        results['ir_ori_shape'] = ir_img.shape[:2]
        if ir_img.shape[:2] != img.shape[:2]:
            if self.on_size_mismatch == 'error':
                raise ValueError(
                    'LoadPairedImageFromFile: visible and infrared sizes '
                    f'differ (visible {img.shape[:2]}, infrared '
                    f'{ir_img.shape[:2]}, as (h, w)); pair: {pair}. The '
                    "pair must be registered; set on_size_mismatch='resize' "
                    'only if both cover the same field of view.')
            if not self._resize_logged:
                log(f'LoadPairedImageFromFile: resizing infrared to the '
                    f'visible size (first: {ir_img.shape[:2]} -> '
                    f'{img.shape[:2]}, {pair}); on_size_mismatch=\'error\' '
                    'turns this off', logging.WARNING)
                self._resize_logged = True
            ir_img = mmcv.imresize(ir_img, (img.shape[1], img.shape[0]))
        if self.to_float32:
            img = img.astype(np.float32)
            ir_img = ir_img.astype(np.float32)
        results['img'] = img
        results['ir_img'] = ir_img
        results['img_shape'] = img.shape[:2]
        results['ori_shape'] = img.shape[:2]
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(color_type={self.color_type!r}, '
                f'ir_color_type={self.ir_color_type!r}, '
                f'on_size_mismatch={self.on_size_mismatch!r}, '
                f'to_float32={self.to_float32}, '
                f'ignore_empty={self.ignore_empty})')

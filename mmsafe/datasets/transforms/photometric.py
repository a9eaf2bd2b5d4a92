"""Photometric transforms applied to one modality at a time."""
import copy
from typing import Optional

import numpy as np
from mmcv.transforms import BaseTransform

from mmsafe.registry import TRANSFORMS, builds_in_mmsafe_scope
from mmsafe.errors import MMSafeKeyError, MMSafeRuntimeError, MMSafeValueError
from .geometry_record import flipped_copy, homography, same_geometry
from .pairing_rules import check_modality_inner

MODALITIES = ('visible', 'infrared', 'both')
_KEY = dict(visible='img', infrared='ir_img')


@TRANSFORMS.register_module()
class ModalityTransform(BaseTransform):
    """Run a photometric transform on one modality only, e.g.
    ``dict(type='ModalityTransform', modality='infrared',
    transform=dict(type='PhotoMetricDistortion'))``.

    The transform sees a small results dict whose ``img`` is the chosen
    modality, so it cannot touch the other image, the boxes or the meta keys.
    With ``modality='both'`` it runs on each modality with its own random
    draw (colour jitter need not be shared; geometry must, see
    :class:`PairedGeometric`).

    A geometric transform (``RandomFlip``, ``Resize``, ``RandomCrop``, ...),
    a mix transform, or a wrapper holding one is refused when this is built
    (:class:`~.pairing_rules.UnpairedTransformError`), and
    at run time a transform that changes the image size, records a
    geometry (``homography_matrix``, ``flip``) or returns the image flipped
    is refused too: it would move one modality only.

    Args:
        modality (str): ``'visible'``, ``'infrared'`` or ``'both'``.
        transform (dict | callable): the photometric transform.
        restore_dtype (bool): cast the result back to the input dtype
            (uint8: rounded and clipped to [0, 255]) so packed inputs stay
            uint8 as PairedDetDataPreprocessor expects; PhotoMetricDistortion
            returns float32 otherwise. Set False for transforms whose output
            is meant to be float (e.g. Normalize). Defaults to True.
    """

    pair_aware = True

    @builds_in_mmsafe_scope
    def __init__(self, modality: str, transform,
                 restore_dtype: bool = True) -> None:
        if modality not in MODALITIES:
            raise MMSafeValueError(
                f'modality must be one of {MODALITIES}, got '
                f'{modality!r}')
        self.modality = modality
        self.transform_cfg = copy.deepcopy(transform)
        self.inner = TRANSFORMS.build(transform) if isinstance(
            transform, dict) else transform
        check_modality_inner(self.inner, modality)
        self.restore_dtype = restore_dtype

    def _apply(self, results: dict, modality: str) -> bool:
        key = _KEY[modality]
        if key not in results:
            raise MMSafeKeyError(
                f'ModalityTransform({modality}): results have no '
                f'{key!r} (sample {results.get("img_path")})')
        img = results[key]
        path = results.get('img_path' if key == 'img' else 'ir_img_path')
        sub = dict(img=img, img_shape=img.shape[:2], img_path=path)
        out = self.inner(sub)
        if out is None:
            return False
        new = out['img']
        moved = None
        if new.shape[:2] != img.shape[:2]:
            moved = f'changed the size {img.shape[:2]} -> {new.shape[:2]}'
        elif out.get('flip'):
            moved = f'flipped it ({out.get("flip_direction")})'
        elif not same_geometry(homography(out, 'homography_matrix'),
                               homography({}, 'homography_matrix')):
            moved = 'recorded a geometric change (homography_matrix)'
        else:
            direction = flipped_copy(img, new)
            if direction:
                moved = f'returned it flipped ({direction})'
        if moved:
            raise MMSafeRuntimeError(
                f'ModalityTransform({type(self.inner).__name__}) {moved} on '
                f'the {modality} image only ({path}): the other modality '
                'keeps its geometry, so the pair no longer lines up. Wrap '
                'geometric transforms in PairedGeometric (or use the '
                'Paired* transforms) instead.')
        if self.restore_dtype and new.dtype != img.dtype:
            if img.dtype == np.uint8:
                new = np.clip(np.round(new), 0, 255)
            new = new.astype(img.dtype)
        results[key] = new
        return True

    def transform(self, results: dict) -> Optional[dict]:
        """Apply the transform to the chosen modality (or to each)."""
        modalities = ('visible', 'infrared') if self.modality == 'both' \
            else (self.modality, )
        for modality in modalities:
            if not self._apply(results, modality):
                return None
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(modality={self.modality!r}, '
                f'transform={self.inner!r}, '
                f'restore_dtype={self.restore_dtype})')

"""A pipeline that checks, step by step, that both modalities keep one
geometry."""
from typing import Any, Callable, Optional, Sequence, Union

from mmengine.dataset import Compose

from .geometry_record import (BOTH, INFRARED, LOG_KEY, VISIBLE,
                              describe_log, flipped_copy, is_pair_aware,
                              log_step, record_step, same_geometry,
                              visible_geometry)


class PairGeometryError(RuntimeError):
    """A pipeline step moved one modality of a pair only."""


class PairedCompose(Compose):
    """:class:`mmengine.dataset.Compose` for paired samples, with the
    run-time pairing check.

    Paired datasets (``LLVIPDataset``, ``PairedModalityDataset``) run their
    pipeline through it. Transforms that keep the pair geometry themselves
    (``pair_aware``: the paired transforms, ``ModalityTransform``, the
    paired loader and packer) run as they are. Every other step, once the
    sample holds both images, is watched: when it changes the visible
    image's size, records a visible geometry (``homography_matrix``) or
    returns the visible image flipped, while leaving the infrared image
    untouched (or the other way round), the sample is refused with
    :class:`PairGeometryError` naming the step. A step that moves both
    images (a user's own paired transform) is recorded as a step of both.
    A mix transform is refused (see :mod:`mmsafe.datasets.pipeline_check`).

    Nothing is changed in a healthy sample: the watch reads shapes, object
    identities and the recorded homography only.

    Args:
        transforms (Sequence[dict | callable]): the pipeline.
        owner (str): the dataset, named in the errors.
    """

    def __init__(self,
                 transforms: Optional[Sequence[Union[dict, Callable]]],
                 owner: str = 'paired pipeline') -> None:
        super().__init__(transforms)
        self.owner = owner

    def __call__(self, data: dict) -> Optional[Any]:
        """Run every step; refuse a step that moves one modality only."""
        for index, t in enumerate(self.transforms):
            watch = (isinstance(data, dict) and 'img' in data
                     and 'ir_img' in data and not is_pair_aware(t))
            if watch:
                self._refuse_mix(index, t, data)
                img, ir_img = data['img'], data['ir_img']
                before = visible_geometry(data)
            data = t(data)
            if data is None:
                return None
            if watch:
                self._check_step(index, t, data, img, ir_img, before)
        return data

    def _name(self, index: int, t: Any) -> str:
        return f'pipeline[{index}] {type(t).__name__}'

    @staticmethod
    def _files(data: dict) -> str:
        return (f"visible={data.get('img_path')} | "
                f"infrared={data.get('ir_img_path')}")

    def _refuse_mix(self, index: int, t: Any, data: dict) -> None:
        from ..pipeline_check import MIX_ADVICE, mix_classes
        if isinstance(t, mix_classes()):
            raise PairGeometryError(
                f'{self.owner}: {self._name(index, t)} mixes several '
                'samples on the visible image only (sample '
                f'{self._files(data)}); {MIX_ADVICE}.')

    def _check_step(self, index: int, t: Any, data: dict, img, ir_img,
                    before) -> None:
        new_img, new_ir = data.get('img'), data.get('ir_img')
        if new_img is None or new_ir is None:
            return
        vis_moved = None
        if new_img.shape[:2] != img.shape[:2]:
            vis_moved = f'size {img.shape[:2]} -> {new_img.shape[:2]}'
        elif not same_geometry(visible_geometry(data), before):
            vis_moved = 'recorded a new homography_matrix'
        else:
            direction = flipped_copy(img, new_img)
            if direction:
                vis_moved = f'flipped ({direction})'
        ir_touched = new_ir is not ir_img
        ir_moved = None
        if new_ir.shape[:2] != ir_img.shape[:2]:
            ir_moved = f'size {ir_img.shape[:2]} -> {new_ir.shape[:2]}'
        elif ir_touched:
            direction = flipped_copy(ir_img, new_ir)
            if direction:
                ir_moved = f'flipped ({direction})'
        name = self._name(index, t)
        if vis_moved and not ir_touched:
            log_step(data, name, VISIBLE)
            self._raise(name, t, data, f'moved the visible image '
                        f'({vis_moved}) but not the infrared one')
        if ir_moved and not vis_moved:
            log_step(data, name, INFRARED)
            self._raise(name, t, data, f'moved the infrared image '
                        f'({ir_moved}) but not the visible one')
        if vis_moved and ir_touched:
            if new_img.shape[:2] != new_ir.shape[:2]:
                self._raise(name, t, data, 'left the two images with '
                            f'different sizes {new_img.shape[:2]} vs '
                            f'{new_ir.shape[:2]}')
            # a user's own transform that moves both: trust its record
            steps = len(data.get(LOG_KEY) or [])
            record_step(data, type(t).__name__, before)
            if len(data.get(LOG_KEY) or []) == steps:
                log_step(data, type(t).__name__, BOTH)

    def _raise(self, name: str, t: Any, data: dict, what: str) -> None:
        from ..pipeline_check import alternative
        raise PairGeometryError(
            f'{self.owner}: {name} {what} (sample {self._files(data)}); '
            'the pair no longer lines up. Fix: '
            f'{alternative(t)}; only photometric transforms may act on one '
            'modality, inside ModalityTransform. Steps: '
            f'{describe_log(data)}')

"""The pipeline of a paired dataset: checked from its transforms when it is
built (:func:`paired_pipeline`), and step by step, that both modalities
keep one geometry, when it runs (:class:`PairedCompose`)."""
from typing import (Any, Callable, Iterable, List, Optional, Sequence,
                    Union)

from mmcv.transforms import RandomChoiceResize, RandomResize
from mmcv.transforms import Resize as MMCV_Resize
from mmengine.dataset import Compose

from mmsafe.errors import MMSafeError, MMSafeValueError
from mmsafe.registry import builds_in_mmsafe_scope
from .geometry_record import (BOTH, INFRARED, LOG_KEY, VISIBLE,
                              describe_log, flipped_copy, is_pair_aware,
                              log_step, record_step, same_geometry,
                              visible_geometry)
from .paired_geometric import PairedGeometric, PairedGeometryMixin
from .pairing_rules import (MIX_ADVICE, UnpairedTransformError, alternative,
                            held_transform, mix_classes,
                            modality_inner_problem, moves_image,
                            paired_geometric_inner_problem,
                            resolve_transform)
from .photometric import ModalityTransform


class PairGeometryError(MMSafeError, RuntimeError):
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
    A mix transform is refused (see :mod:`.pairing_rules`).

    Nothing is changed in a healthy sample: the watch reads shapes, object
    identities and the recorded homography only.

    Args:
        transforms (Sequence[dict | callable]): the pipeline.
        owner (str): the dataset, named in the errors.
    """

    @builds_in_mmsafe_scope
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
        raise PairGeometryError(
            f'{self.owner}: {name} {what} (sample {self._files(data)}); '
            'the pair no longer lines up. Fix: '
            f'{alternative(t)}; only photometric transforms may act on one '
            'modality, inside ModalityTransform. Steps: '
            f'{describe_log(data)}')


def pipeline_problems(transforms: Iterable[Any],
                      where: str = 'pipeline') -> List[str]:
    """Every transform of a paired pipeline that would move or mix one
    modality only.

    Args:
        transforms (Iterable): built transforms or their configs.
        where (str): how to name the pipeline in the messages
            (``'train_dataloader.dataset.pipeline'``).

    Returns:
        list[str]: one message per problem (empty: the pipeline is fine).
    """
    problems = []
    for index, transform in enumerate(transforms):
        cls, name = resolve_transform(transform)
        loc = f'{where}[{index}] {name}'
        if cls is None:
            continue
        if issubclass(cls, ModalityTransform):
            modality = (transform.get('modality') if isinstance(
                transform, dict) else getattr(transform, 'modality', '?'))
            problem = modality_inner_problem(held_transform(transform),
                                             modality)
        elif issubclass(cls, PairedGeometric):
            problem = paired_geometric_inner_problem(
                held_transform(transform))
        else:
            why = moves_image(transform)
            problem = None if why is None else (
                f'{why} and acts on the visible image ("img") only: the '
                'infrared image would keep its geometry, so the pair (and '
                f'its boxes) would no longer line up. Fix: '
                f'{alternative(transform)}.')
        if problem:
            problems.append(f'{loc}: {problem}')
    return problems


def assert_paired_pipeline(transforms: Sequence[Any], owner: str) -> None:
    """Raise :class:`UnpairedTransformError` naming every problem of a
    paired pipeline (see :func:`pipeline_problems`)."""
    problems = pipeline_problems(transforms)
    if problems:
        raise UnpairedTransformError(
            f'{owner}: the paired pipeline would break the visible/infrared '
            f'pairing:\n  ' + '\n  '.join(problems) + '\nEvery geometric '
            'transform must move both modalities (Paired* transforms, '
            'PairedGeometric); ModalityTransform is for photometric ones.')


def check_reduced_decode_resize(transforms: Sequence[Any],
                                owner: str) -> None:
    """Refuse a pipeline whose reduced-decoding loader has no paired resize
    after it (nothing would fold the decode into ``scale_factor``, see
    :mod:`.reduced_jpeg_decode`)."""
    resizes = (MMCV_Resize, RandomResize, RandomChoiceResize)
    for index, t in enumerate(transforms):
        if getattr(t, 'reduced_decode', None) is None:
            continue
        if not any((isinstance(n, PairedGeometryMixin)
                    and isinstance(n, resizes)) or
                   (isinstance(n, PairedGeometric)
                    and isinstance(n.inner, resizes))
                   for n in transforms[index + 1:]):
            raise MMSafeValueError(
                f'{owner}: pipeline[{index}] {type(t).__name__} decodes '
                'reduced (reduced_decode) but no paired resize '
                '(PairedResize, PairedRandomResize, ...) follows it: '
                'scale_factor would not reach the original size. Add the '
                'resize or set reduced_decode=None.')


def paired_pipeline(pipeline, owner: str) -> PairedCompose:
    """Check a paired dataset's pipeline statically and return it as a
    :class:`PairedCompose` (the run-time check).

    Args:
        pipeline (Compose | Sequence): the built pipeline or its configs.
        owner (str): the dataset, named in the errors.

    Raises:
        UnpairedTransformError: a transform would move or mix one modality
            only (see :func:`pipeline_problems`).
    """
    transforms = list(getattr(pipeline, 'transforms', pipeline) or [])
    assert_paired_pipeline(transforms, owner)
    check_reduced_decode_resize(transforms, owner)
    return PairedCompose(transforms, owner=owner)

"""Geometric transforms that move visible and infrared identically.

How: the wrapped MMDetection / MMCV transform runs once on the visible
results and once on a copy that holds the infrared image, and the global
random state (``random`` and ``numpy``) is rewound between the two runs, so
both runs draw the same random numbers: one random draw drives both
modalities. The transform is used as it is (no channel stacking, so cv2's
limits on channel counts and the pillow backend do not matter), and the
boxes, masks and meta keys come from the visible run.

Torch's global random state is rewound too, so a transform drawing from
``torch`` is paired as well. A transform that draws from its own generator
(an ``np.random.Generator``, ``random.Random`` or ``torch.Generator``
attribute) cannot be rewound and is refused when it is wrapped.

Identity is checked, not assumed: after the two runs the output sizes, the
recorded geometry (``homography_matrix``, ``scale_factor``, ``flip``,
``crop``/``pad`` shapes ...) and the random state they leave behind must be
equal, else the transform is not pairable (for example its random draws
depend on pixel values) and an error names it. What the step did is then
recorded as the geometry of both modalities (see :mod:`.geometry_record`).

``PairedResize`` and ``PairedRandomFlip`` replay instead: what they do to
an image follows from the visible run's record alone (the output
``scale``; ``flip`` and ``flip_direction``), so the infrared image is
resized or flipped from that record with the very call the infrared run
would make, without a second run over copied annotations. Same images,
same random state afterwards (one draw, as the rewound second run leaves
it); a sample whose two images differ in size, or that mixes samples in,
takes the two runs.
"""
import copy
import random
from typing import Callable, Optional

import mmcv
import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmcv.transforms import RandomChoiceResize as MMCV_RandomChoiceResize
from mmcv.transforms import RandomResize as MMCV_RandomResize

from mmdet.datasets.transforms import (FixShapeResize, Pad, RandomCrop,
                                       RandomFlip, Resize)
from mmsafe.registry import TRANSFORMS, builds_in_mmsafe_scope
from mmsafe.errors import (MMSafeAttributeError, MMSafeKeyError,
                           MMSafeRuntimeError)
from .geometry_record import record_step, visible_geometry
from .pairing_rules import check_paired_geometric_inner
from .reduced_jpeg_decode import fold_decode, pending_decode
from .same_size import SameSizeResizeMixin

#: result keys that describe the geometry; they must agree between the runs
GEOMETRY_KEYS = ('img_shape', 'scale', 'scale_factor', 'keep_ratio', 'flip',
                 'flip_direction', 'homography_matrix', 'pad_shape',
                 'crop_size', 'border')
_IMAGE_KEYS = ('img', 'ir_img')


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and bool(
            np.allclose(a, b, rtol=1e-6, atol=1e-6))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _same_rng_state(a, b) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def apply_paired(
        transform: Callable[[dict], Optional[dict]],
        results: dict,
        name: str,
        replay: Optional[Callable[[dict, np.ndarray], np.ndarray]] = None
) -> Optional[dict]:
    """Run a single-image geometric ``transform`` on both modalities with one
    random draw.

    Args:
        transform (callable): takes and returns a results dict (or None).
        results (dict): paired results with ``img`` and ``ir_img``.
        name (str): the transform's name, for error messages.
        replay (callable, optional): ``replay(out, ir_img)`` gives the
            infrared image from the visible run's results ``out`` exactly
            as a second run of ``transform`` on it would; used when both
            images have one size and nothing is mixed in. None: two runs.

    Returns:
        dict | None: the visible run's results with ``ir_img`` from the
        infrared run; None when the transform rejects the sample.
    """
    if 'ir_img' not in results:
        raise MMSafeKeyError(
            f'{name}: results have no "ir_img" (sample '
            f'{results.get("img_path")}); load pairs with '
            'LoadPairedImageFromFile, or use the plain transform for '
            'single-modality data.')
    ir_img = results.pop('ir_img')
    # a reduced decode is folded into the first step that resizes
    decode = pending_decode(results)
    img = results.get('img')
    if replay is not None and isinstance(img, np.ndarray) and \
            isinstance(ir_img, np.ndarray) and \
            'mix_results' not in results and \
            img.shape[:2] == ir_img.shape[:2]:
        return _replayed(transform, replay, results, ir_img, decode, name)
    # the infrared run gets its own copy of the annotations: transforms
    # change boxes in place (flip_, translate_)
    ir_results = {
        k: copy.deepcopy(v)
        for k, v in results.items()
        if k not in _IMAGE_KEYS and k != 'mix_results'
    }
    ir_results['img'] = ir_img
    if 'mix_results' in results:
        # a mix transform (Mosaic, MixUp): the infrared run mixes the
        # infrared images of the same partners
        ir_results['mix_results'] = [
            _infrared_view(m, name) for m in results['mix_results']
        ]
    before = visible_geometry(results)
    py_state, np_state = random.getstate(), np.random.get_state()
    torch_state = torch.get_rng_state()
    out = transform(results)
    if out is None:
        return None
    py_after, np_after = random.getstate(), np.random.get_state()
    torch_after = torch.get_rng_state()
    random.setstate(py_state)
    np.random.set_state(np_state)
    torch.set_rng_state(torch_state)
    ir_out = transform(ir_results)
    paths = (f'visible={results.get("img_path")} | '
             f'infrared={results.get("ir_img_path")}')
    if ir_out is None:
        raise MMSafeRuntimeError(
            f'{name} accepted the visible image but rejected '
            f'the infrared one ({paths}); it is not pairable.')
    if not (random.getstate() == py_after
            and _same_rng_state(np.random.get_state(), np_after)
            and torch.equal(torch.get_rng_state(), torch_after)):
        raise MMSafeRuntimeError(
            f'{name} drew different random numbers for the visible and the '
            f'infrared image ({paths}): its randomness depends on the image, '
            'so it cannot be applied identically to both. Use it inside '
            'ModalityTransform only if it is photometric.')
    if out['img'].shape[:2] != ir_out['img'].shape[:2]:
        raise MMSafeRuntimeError(
            f'{name} gave different sizes: visible {out["img"].shape[:2]}, '
            f'infrared {ir_out["img"].shape[:2]} ({paths})')
    for key in GEOMETRY_KEYS:
        if key in out or key in ir_out:
            if not _same(out.get(key), ir_out.get(key)):
                raise MMSafeRuntimeError(
                    f'{name} gave different {key!r} for the two modalities: '
                    f'visible {out.get(key)}, infrared {ir_out.get(key)} '
                    f'({paths})')
    out['ir_img'] = ir_out['img']
    fold_decode(out, decode)
    record_step(out, name, before)
    return out


def _replayed(transform: Callable[[dict], Optional[dict]],
              replay: Callable[[dict, np.ndarray], np.ndarray],
              results: dict, ir_img: np.ndarray, decode: Optional[tuple],
              name: str) -> Optional[dict]:
    """One run on the visible results, the infrared image replayed from
    its record; bookkeeping as in :func:`apply_paired`."""
    before = visible_geometry(results)
    out = transform(results)
    if out is None:
        return None
    ir_out = replay(out, ir_img)
    if out['img'].shape[:2] != ir_out.shape[:2]:
        raise MMSafeRuntimeError(
            f'{name} gave different sizes: visible {out["img"].shape[:2]}, '
            f'infrared {ir_out.shape[:2]} (visible={results.get("img_path")}'
            f' | infrared={results.get("ir_img_path")})')
    out['ir_img'] = ir_out
    fold_decode(out, decode)
    record_step(out, name, before)
    return out


def _infrared_view(mixed: dict, name: str) -> dict:
    """A mixed-in sample's results with its infrared image as ``img``."""
    if 'ir_img' not in mixed:
        raise MMSafeKeyError(
            f'{name}: a mixed-in sample ({mixed.get("img_path")}) has no '
            '"ir_img": the dataset inside MultiImageMixDataset must load '
            'pairs (LoadPairedImageFromFile).')
    view = {
        k: copy.deepcopy(v)
        for k, v in mixed.items() if k not in _IMAGE_KEYS
    }
    view['img'] = mixed['ir_img']
    return view


class PairedGeometryMixin:
    """Mixin that makes a single-image geometric transform paired.

    Put it first in the bases: ``class PairedResize(PairedGeometryMixin,
    Resize)``.
    """

    pair_aware = True

    def transform(self, results: dict) -> Optional[dict]:
        """Apply the transform identically to ``img`` and ``ir_img``."""
        # a subclass replays only with a replay of its own: it may change
        # what the transform does to the image
        replay = type(self).__dict__.get('replay_infrared')
        return apply_paired(
            super().transform, results, type(self).__name__,
            None if replay is None else self.replay_infrared)


@TRANSFORMS.register_module()
class PairedGeometric(BaseTransform):
    """Make any single-image geometric transform paired, e.g.
    ``dict(type='PairedGeometric', transform=dict(type='RandomAffine'))``.

    ``Mosaic`` and ``MixUp`` work on pairs this way inside MMDetection's
    ``MultiImageMixDataset``: the infrared run mixes the infrared images
    of the same mixed-in samples with the same draw (same tiles, same
    placement)::

        dict(type='MultiImageMixDataset', dataset=dict(type='LLVIPDataset',
             ..., pipeline=[dict(type='LoadPairedImageFromFile'),
                            dict(type='LoadAnnotations', with_bbox=True)]),
             pipeline=[dict(type='PairedGeometric',
                            transform=dict(type='Mosaic', img_scale=...)),
                       ..., dict(type='PackPairedDetInputs')])

    Refused when it is built (:class:`UnpairedTransformError`): the mix
    transforms that keep their own cache or need masks (``CachedMosaic``,
    ``CachedMixUp``, ``CopyPaste``) and a transform that draws from its
    own random generator (its draw cannot be repeated for infrared).

    Args:
        transform (dict | callable): the transform (config or object).
    """

    pair_aware = True

    @builds_in_mmsafe_scope
    def __init__(self, transform) -> None:
        self.transform_cfg = copy.deepcopy(transform)
        self.inner = TRANSFORMS.build(transform) if isinstance(
            transform, dict) else transform
        check_paired_geometric_inner(self.inner)

    def transform(self, results: dict) -> Optional[dict]:
        """Apply the inner transform identically to ``img`` and ``ir_img``."""
        return apply_paired(self.inner, results,
                            f'PairedGeometric({type(self.inner).__name__})')

    @property
    def get_indexes(self):
        """The inner mix transform's ``get_indexes`` (what
        ``MultiImageMixDataset`` looks for); absent for other transforms."""
        fn = getattr(self.inner, 'get_indexes', None)
        if fn is None:
            raise MMSafeAttributeError(
                f'{type(self.inner).__name__} has no get_indexes')
        return fn

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.inner!r})'


@TRANSFORMS.register_module()
class PairedResize(PairedGeometryMixin, SameSizeResizeMixin, Resize):
    """:class:`mmdet.datasets.transforms.Resize` for visible + infrared.

    A resize to the image's own size (after a reduced decode) keeps the
    arrays instead of copying them; every field is written as ``Resize``
    writes it (see :mod:`.same_size`).
    """

    def replay_infrared(self, out: dict, ir_img: np.ndarray) -> np.ndarray:
        """The infrared image resized to the visible run's ``scale`` by the
        visible run's own image resize."""
        ir = dict(img=ir_img, scale=out['scale'])
        self._resize_img(ir)
        return ir['img']


@TRANSFORMS.register_module()
class PairedFixShapeResize(PairedGeometryMixin, FixShapeResize):
    """:class:`mmdet.datasets.transforms.FixShapeResize`, paired."""


@TRANSFORMS.register_module()
class PairedRandomResize(PairedGeometryMixin, MMCV_RandomResize):
    """:class:`mmcv.transforms.RandomResize` for visible + infrared (one
    random scale for both). ``resize_type`` defaults to MMDetection's
    ``Resize`` (which scales the boxes) whatever the default scope."""

    def __init__(self, *args, resize_type=Resize, **kwargs) -> None:
        super().__init__(*args, resize_type=resize_type, **kwargs)


@TRANSFORMS.register_module()
class PairedRandomChoiceResize(PairedGeometryMixin, MMCV_RandomChoiceResize):
    """:class:`mmcv.transforms.RandomChoiceResize`, paired (one choice);
    ``resize_type`` defaults to MMDetection's ``Resize``."""

    def __init__(self, *args, resize_type=Resize, **kwargs) -> None:
        super().__init__(*args, resize_type=resize_type, **kwargs)


@TRANSFORMS.register_module()
class PairedRandomFlip(PairedGeometryMixin, RandomFlip):
    """:class:`mmdet.datasets.transforms.RandomFlip`, one draw for both."""

    def replay_infrared(self, out: dict, ir_img: np.ndarray) -> np.ndarray:
        """The infrared image flipped as ``RandomFlip._flip`` flipped the
        visible one (``mmcv.imflip`` in the drawn direction), or as it is
        when the draw was no flip."""
        if not out['flip']:
            return ir_img
        return mmcv.imflip(ir_img, direction=out['flip_direction'])


@TRANSFORMS.register_module()
class PairedRandomCrop(PairedGeometryMixin, RandomCrop):
    """:class:`mmdet.datasets.transforms.RandomCrop`, one crop for both."""


@TRANSFORMS.register_module()
class PairedPad(PairedGeometryMixin, Pad):
    """:class:`mmdet.datasets.transforms.Pad` for visible + infrared (both
    padded to the same shape with ``pad_val``)."""

"""What each transform may do to a paired (visible + infrared) sample: the
per-transform rules of the pairing checks.

A geometric transform that moves ``img`` only (MMDetection's ``RandomFlip``
placed directly in a paired pipeline, or held by ``ModalityTransform``)
leaves the infrared image in the old geometry: the pair and its boxes no
longer line up, and nothing crashes. Mix transforms (``Mosaic``,
``MixUp``, ...) mix the visible images of several samples but not their
infrared partners. The tables here name those MMDetection / MMCV
transforms (by class, subclasses included), the wrappers looked into, and
the paired way to write each; the functions judge one transform, built or
as its config: what ``ModalityTransform`` and ``PairedGeometric`` may
hold (checked when they are built), and the advice that the checks of a
whole pipeline (:mod:`.compose`, :mod:`mmsafe.datasets.pipeline_check`)
print.

Nothing here imports mmsafe's transforms: they import these rules.
"""
import random
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

from mmsafe.errors import MMSafeError

#: MMDetection / MMCV transforms that move the image (by class name; any
#: subclass counts too)
_GEOMETRIC = {
    'mmdet.datasets.transforms': (
        'RandomFlip', 'Resize', 'FixShapeResize', 'ResizeShortestEdge',
        'RandomCrop', 'RandomAffine', 'RandomShift', 'Expand',
        'MinIoURandomCrop', 'Pad', 'RandomCenterCropPad', 'GeomTransform',
        'AutoAugment', 'RandAugment'),
    'mmcv.transforms': ('Resize', 'RandomResize', 'RandomChoiceResize',
                        'RandomFlip', 'Pad', 'CenterCrop'),
}
#: transforms that mix several samples
_MIX = {
    'mmdet.datasets.transforms': ('Mosaic', 'MixUp', 'CachedMosaic',
                                  'CachedMixUp', 'CopyPaste'),
}
#: mix transforms that PairedGeometric pairs (stateless, global randomness)
_PAIRABLE_MIX = {'mmdet.datasets.transforms': ('Mosaic', 'MixUp')}
#: wrappers whose ``transforms`` are looked into
_WRAPPERS = {'mmcv.transforms': ('Compose', 'RandomChoice', 'RandomApply')}
#: transforms whose randomness is a library's own (cannot be rewound)
_OWN_RANDOMNESS = ('Albu', )
#: the paired counterpart of a single-image transform, by class name
PAIRED_ALTERNATIVE = {
    'RandomFlip': 'PairedRandomFlip',
    'Resize': 'PairedResize',
    'RandomResize': 'PairedRandomResize',
    'RandomChoiceResize': 'PairedRandomChoiceResize',
    'FixShapeResize': 'PairedFixShapeResize',
    'RandomCrop': 'PairedRandomCrop',
    'Pad': 'PairedPad',
}
MIX_ADVICE = (
    'the infrared partners of the mixed-in samples would not be mixed. '
    "Mosaic and MixUp work on pairs as dict(type='PairedGeometric', "
    "transform=dict(type='Mosaic', ...)) in MultiImageMixDataset's pipeline; "
    'CachedMosaic, CachedMixUp and CopyPaste have no paired version (their '
    'cache / masks): use PairedGeometric(Mosaic / MixUp), or '
    'PairedRandomResize + PairedRandomCrop + PairedRandomFlip')


class UnpairedTransformError(MMSafeError, ValueError):
    """A transform would move or mix one modality of a pair only."""


def _classes(table: dict) -> Tuple[type, ...]:
    import importlib
    found = []
    for module, names in table.items():
        mod = importlib.import_module(module)
        found += [getattr(mod, n) for n in names if hasattr(mod, n)]
    return tuple(found)


def geometric_classes() -> Tuple[type, ...]:
    """MMDetection / MMCV transform classes that move the image."""
    return _classes(_GEOMETRIC)


def mix_classes() -> Tuple[type, ...]:
    """MMDetection transform classes that mix several samples."""
    return _classes(_MIX)


def pairable_mix_classes() -> Tuple[type, ...]:
    """Mix transforms that :class:`PairedGeometric` applies to pairs."""
    return _classes(_PAIRABLE_MIX)


def resolve_transform(transform: Any) -> Tuple[Optional[type], str]:
    """``(class, name)`` of a built transform or of its config."""
    if isinstance(transform, dict):
        typ = transform.get('type')
        if isinstance(typ, type):
            return typ, typ.__name__
        if not isinstance(typ, str):
            return None, str(typ)
        from mmsafe.registry import TRANSFORMS, resolve
        # as a build in the current default scope would (an unknown scope
        # prefix gives None: the registry check says)
        return resolve(TRANSFORMS, typ), typ.split('.')[-1]
    if callable(transform):
        return type(transform), type(transform).__name__
    return None, repr(transform)


def _children(transform: Any) -> List[Any]:
    """The transforms a wrapper (Compose, RandomChoice, RandomApply)
    holds."""
    items = transform.get('transforms', []) if isinstance(
        transform, dict) else getattr(transform, 'transforms', [])
    out: List[Any] = []
    for item in items or []:
        if isinstance(item, (list, tuple)):
            out += list(item)
        elif not isinstance(item, dict) and hasattr(item, 'transforms'):
            out += _children(item)
        else:
            out.append(item)
    return out


def held_transform(transform: Any) -> Any:
    """The transform held by ModalityTransform / PairedGeometric."""
    if isinstance(transform, dict):
        return transform.get('transform')
    return getattr(transform, 'inner', None)


def own_generators(transform: Any) -> List[str]:
    """Attributes of ``transform`` holding their own random generator
    (``np.random.Generator`` / ``RandomState``, ``random.Random``,
    ``torch.Generator``): draws that no global-state rewind repeats."""
    if isinstance(transform, dict):
        return []
    kinds = (np.random.Generator, np.random.RandomState, random.Random,
             torch.Generator)
    return sorted(k for k, v in vars(transform).items()
                  if isinstance(v, kinds)) if hasattr(transform,
                                                      '__dict__') else []


def moves_image(transform: Any) -> Optional[str]:
    """Why ``transform`` (or a transform it wraps) moves or mixes the
    image, or None."""
    cls, name = resolve_transform(transform)
    if cls is None:
        return None
    if issubclass(cls, mix_classes()):
        return f'{name} mixes several samples'
    if getattr(cls, 'pair_aware', False):
        return None
    if issubclass(cls, geometric_classes()):
        return f'{name} is geometric'
    if issubclass(cls, _classes(_WRAPPERS)):
        for child in _children(transform):
            why = moves_image(child)
            if why:
                return f'{name} holds {why}'
    return None


def alternative(transform: Any) -> str:
    """The paired way to write ``transform`` (a config line)."""
    cls, name = resolve_transform(transform)
    if cls is not None and issubclass(cls, mix_classes()):
        return MIX_ADVICE
    paired = PAIRED_ALTERNATIVE.get(name)
    if paired:
        return (f"use dict(type='{paired}', ...) with the same arguments, "
                f"or dict(type='PairedGeometric', transform=dict("
                f"type='{name}', ...))")
    return (f"wrap it: dict(type='PairedGeometric', transform=dict("
            f"type='{name}', ...))")


def modality_inner_problem(inner: Any, modality: str) -> Optional[str]:
    """Why ``ModalityTransform(modality, inner)`` is refused, or None."""
    why = moves_image(inner)
    if why is None:
        return None
    _, name = resolve_transform(inner)
    return (f"ModalityTransform(modality='{modality}') holds {name}: {why} "
            f'and would move the {modality} image only, so the pair (and '
            f'its boxes) would no longer line up. ModalityTransform is for '
            f'photometric transforms; for {name}, {alternative(inner)}.')


def paired_geometric_inner_problem(inner: Any) -> Optional[str]:
    """Why ``PairedGeometric(inner)`` is refused, or None."""
    cls, name = resolve_transform(inner)
    if cls is not None and issubclass(cls, mix_classes()) and \
            cls not in pairable_mix_classes():
        return (f'PairedGeometric({name}): {name} mixes samples and keeps a '
                f'cache or needs masks: it cannot be paired; {MIX_ADVICE}.')
    if name in _OWN_RANDOMNESS:
        return (f'PairedGeometric({name}): {name} draws from its library\'s '
                'own random generator, which cannot be rewound to give the '
                'infrared image the same draw. Use the Paired* transforms '
                'or PairedGeometric with an MMDetection transform.')
    gens = own_generators(inner)
    if gens:
        return (f'PairedGeometric({name}): its attribute(s) {gens} hold an '
                'own random generator, which cannot be rewound to give the '
                'infrared image the same draw. Draw from numpy\'s / '
                "Python's / torch's global random state instead (the paired "
                'wrappers rewind those).')
    return None


def check_modality_inner(inner: Any, modality: str) -> None:
    """Raise :class:`UnpairedTransformError` when ModalityTransform's
    ``inner`` would move one modality."""
    problem = modality_inner_problem(inner, modality)
    if problem:
        raise UnpairedTransformError(problem)


def check_paired_geometric_inner(inner: Any) -> None:
    """Raise :class:`UnpairedTransformError` when PairedGeometric cannot
    pair ``inner``."""
    problem = paired_geometric_inner_problem(inner)
    if problem:
        raise UnpairedTransformError(problem)

"""Static check of a paired (visible + infrared) pipeline.

A geometric transform that moves ``img`` only (MMDetection's ``RandomFlip``
placed directly in a paired pipeline, or held by ``ModalityTransform``)
leaves the infrared image in the old geometry: the pair and its boxes no
longer line up, and nothing crashes. Mix transforms (``Mosaic``,
``MixUp``, ...) mix the visible images of several samples but not their
infrared partners. Both are found here from the pipeline alone, when the
dataset is built (and by ``tools/preflight.py`` / ``tools/check_dataset.py``
from the config), before a sample is loaded.

The check works on built transforms and on their configs alike. A
transform it does not know is left to the run-time check of
:class:`~mmsafe.datasets.transforms.PairedCompose`.
"""
import random
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .walk import config_nodes

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


class UnpairedTransformError(ValueError):
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


def _resolve(transform: Any) -> Tuple[Optional[type], str]:
    """``(class, name)`` of a built transform or of its config."""
    if isinstance(transform, dict):
        typ = transform.get('type')
        if isinstance(typ, type):
            return typ, typ.__name__
        if not isinstance(typ, str):
            return None, str(typ)
        from mmdet.registry import TRANSFORMS
        try:
            cls = TRANSFORMS.get(typ)
        except KeyError:  # an unknown scope prefix: the registry check says
            cls = None
        return cls, typ.split('.')[-1]
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


def _inner(transform: Any) -> Any:
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


def _moves_image(transform: Any) -> Optional[str]:
    """Why ``transform`` (or a transform it wraps) moves or mixes the
    image, or None."""
    cls, name = _resolve(transform)
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
            why = _moves_image(child)
            if why:
                return f'{name} holds {why}'
    return None


def alternative(transform: Any) -> str:
    """The paired way to write ``transform`` (a config line)."""
    cls, name = _resolve(transform)
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
    why = _moves_image(inner)
    if why is None:
        return None
    _, name = _resolve(inner)
    return (f"ModalityTransform(modality='{modality}') holds {name}: {why} "
            f'and would move the {modality} image only, so the pair (and '
            f'its boxes) would no longer line up. ModalityTransform is for '
            f'photometric transforms; for {name}, {alternative(inner)}.')


def paired_geometric_inner_problem(inner: Any) -> Optional[str]:
    """Why ``PairedGeometric(inner)`` is refused, or None."""
    cls, name = _resolve(inner)
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
    from .transforms import ModalityTransform, PairedGeometric
    problems = []
    for index, transform in enumerate(transforms):
        cls, name = _resolve(transform)
        loc = f'{where}[{index}] {name}'
        if cls is None:
            continue
        if issubclass(cls, ModalityTransform):
            modality = (transform.get('modality') if isinstance(
                transform, dict) else getattr(transform, 'modality', '?'))
            problem = modality_inner_problem(_inner(transform), modality)
        elif issubclass(cls, PairedGeometric):
            problem = paired_geometric_inner_problem(_inner(transform))
        else:
            why = _moves_image(transform)
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


def _dataset_class(node: Any) -> Optional[type]:
    typ = node.get('type') if isinstance(node, dict) else None
    if isinstance(typ, type):
        return typ
    if not isinstance(typ, str):
        return None
    from mmdet.registry import DATASETS
    try:
        return DATASETS.get(typ)
    except KeyError:
        return None


def _is_paired_dataset(node: Any) -> bool:
    from . import LLVIPDataset, PairedModalityDataset
    cls = _dataset_class(node)
    if cls is None:
        return False
    if issubclass(cls, PairedModalityDataset):
        return True
    return issubclass(cls, LLVIPDataset) and node.get(
        'return_modality_pair', True) is not False


def _holds_paired(node: Any) -> bool:
    """Whether a dataset config is paired or wraps a paired dataset."""
    return any(_is_paired_dataset(n) for _, n in config_nodes(node))


def _pipeline_is_paired(pipeline: Sequence[Any]) -> bool:
    for transform in pipeline:
        cls, _ = _resolve(transform)
        if cls is not None and getattr(cls, 'pair_aware', False):
            return True
    return False


def config_pipeline_problems(dataset_cfg: Any,
                             where: str = 'dataset') -> List[str]:
    """:func:`pipeline_problems` of every pipeline of a dataset config that
    sees paired samples: the pipeline of a paired dataset, of a wrapper
    around one (``MultiImageMixDataset``, ...), or any pipeline holding a
    paired transform.

    Args:
        dataset_cfg (dict): e.g. ``cfg.train_dataloader.dataset``.
        where (str): the config path of ``dataset_cfg``, for the messages.

    Returns:
        list[str]: one message per problem.
    """
    problems: List[str] = []
    for path, node in config_nodes(dataset_cfg, where):
        pipeline = node.get('pipeline')
        if pipeline and (_holds_paired(node)
                         or _pipeline_is_paired(pipeline)):
            problems += pipeline_problems(pipeline, f'{path}.pipeline')
    return problems


def assert_wrapper_pipelines_paired(dataset: Any, where: str = 'the dataset',
                                    _depth: int = 0) -> None:
    """Refuse a built dataset wrapper whose own pipeline would move or mix
    one modality of the pairs it wraps (e.g. a plain ``Mosaic`` or
    ``MixUp`` in a ``MultiImageMixDataset`` over a paired dataset; each
    paired dataset checks its own pipeline when it is built).

    Raises:
        UnpairedTransformError: naming the wrapper, the transforms and the
            paired alternative (``PairedGeometric``).
    """
    from .walk import MAX_DEPTH, inner_datasets, is_paired_dataset
    inner = inner_datasets(dataset)
    if not inner or _depth > MAX_DEPTH:
        return
    pipeline = getattr(dataset, 'pipeline', None)
    transforms = getattr(pipeline, 'transforms', pipeline)
    if isinstance(transforms, (list, tuple)) and transforms and any(
            is_paired_dataset(d) for d in inner):
        assert_paired_pipeline(
            list(transforms), f'{where} ({type(dataset).__name__}, around '
            'a paired dataset)')
    for i, child in enumerate(inner):
        assert_wrapper_pipelines_paired(child, f'{where}.dataset'
                                        if len(inner) == 1 else
                                        f'{where}.datasets[{i}]', _depth + 1)

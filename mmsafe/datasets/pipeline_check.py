"""Static check of the pipelines in a dataset config, and of a built
dataset wrapper's own pipeline.

A geometric transform that moves ``img`` only (MMDetection's ``RandomFlip``
placed directly in a paired pipeline, or held by ``ModalityTransform``)
leaves the infrared image in the old geometry: the pair and its boxes no
longer line up, and nothing crashes. Mix transforms (``Mosaic``,
``MixUp``, ...) mix the visible images of several samples but not their
infrared partners. Both are found from the pipeline alone, before a sample
is loaded: by each paired dataset when it is built
(:func:`~mmsafe.datasets.transforms.compose.assert_paired_pipeline`), here
for every pipeline of a config that sees paired samples
(:func:`config_pipeline_problems`: ``tools/preflight.py``,
``tools/check_dataset.py``) and for the pipeline of a built wrapper around
a paired dataset (:func:`assert_wrapper_pipelines_paired`: SafeRunner's
loader build).

The check works on built transforms and on their configs alike. What each
transform may do is in :mod:`mmsafe.datasets.transforms.pairing_rules`; a
transform it does not know is left to the run-time check of
:class:`~mmsafe.datasets.transforms.PairedCompose`. This module sits above
the transforms and the datasets (it imports them, they do not import it),
and the names of the per-transform and per-pipeline checks are importable
from here too.
"""
from typing import Any, List, Optional, Sequence

from .llvip import LLVIPDataset
from .paired_dataset import PairedModalityDataset
from .transforms.compose import (assert_paired_pipeline,  # noqa: F401
                                 pipeline_problems)
from .transforms.pairing_rules import (  # noqa: F401
    MIX_ADVICE, PAIRED_ALTERNATIVE, UnpairedTransformError, alternative,
    check_modality_inner, check_paired_geometric_inner, geometric_classes,
    mix_classes, modality_inner_problem, own_generators,
    pairable_mix_classes, paired_geometric_inner_problem, resolve_transform)
from .walk import MAX_DEPTH, config_nodes, inner_datasets, is_paired_dataset


def _dataset_class(node: Any) -> Optional[type]:
    typ = node.get('type') if isinstance(node, dict) else None
    if isinstance(typ, type):
        return typ
    if not isinstance(typ, str):
        return None
    from mmsafe.registry import DATASETS, resolve
    return resolve(DATASETS, typ)


def _is_paired_dataset(node: Any) -> bool:
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
        cls, _ = resolve_transform(transform)
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

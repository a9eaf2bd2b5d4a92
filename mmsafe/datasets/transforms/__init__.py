"""Paired (visible + infrared) transforms."""
from .compose import PairedCompose, PairGeometryError
from .formatting import PackPairedDetInputs
from .paired_geometric import (PairedFixShapeResize, PairedGeometric,
                               PairedGeometryMixin, PairedPad,
                               PairedRandomChoiceResize, PairedRandomCrop,
                               PairedRandomFlip, PairedRandomResize,
                               PairedResize, apply_paired)
from .loading import LoadPairedImageFromFile
from .keep_freed_memory import KeepFreedMemory
from .photometric import ModalityTransform
from .single_modality_reduced import (DecodeAwareResize,
                                      LoadImageFromFileReduced)

__all__ = [
    'LoadPairedImageFromFile', 'PairedGeometric', 'PairedGeometryMixin',
    'PairedResize', 'PairedFixShapeResize', 'PairedRandomResize',
    'PairedRandomChoiceResize', 'PairedRandomFlip', 'PairedRandomCrop',
    'PairedPad', 'ModalityTransform', 'PackPairedDetInputs', 'apply_paired',
    'PairedCompose', 'PairGeometryError', 'paired_pipeline',
    'LoadImageFromFileReduced', 'DecodeAwareResize', 'KeepFreedMemory'
]


def paired_pipeline(pipeline, owner: str) -> PairedCompose:
    """Check a paired dataset's pipeline statically and return it as a
    :class:`PairedCompose` (the run-time check).

    Args:
        pipeline (Compose | Sequence): the built pipeline or its configs.
        owner (str): the dataset, named in the errors.

    Raises:
        UnpairedTransformError: a transform would move or mix one modality
            only (see :mod:`mmsafe.datasets.pipeline_check`).
    """
    from ..pipeline_check import assert_paired_pipeline
    from .reduced_jpeg_decode import check_pipeline
    transforms = list(getattr(pipeline, 'transforms', pipeline) or [])
    assert_paired_pipeline(transforms, owner)
    check_pipeline(transforms, owner)
    return PairedCompose(transforms, owner=owner)

"""Paired (visible + infrared) transforms."""
from .compose import PairedCompose, PairGeometryError, paired_pipeline
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

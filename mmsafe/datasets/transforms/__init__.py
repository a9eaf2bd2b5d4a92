"""Paired (visible + infrared) transforms."""
from .formatting import PackPairedDetInputs
from .geometric import (PairedFixShapeResize, PairedGeometric,
                        PairedGeometryMixin, PairedPad,
                        PairedRandomChoiceResize, PairedRandomCrop,
                        PairedRandomFlip, PairedRandomResize, PairedResize,
                        apply_paired)
from .loading import LoadPairedImageFromFile
from .photometric import ModalityTransform

__all__ = [
    'LoadPairedImageFromFile', 'PairedGeometric', 'PairedGeometryMixin',
    'PairedResize', 'PairedFixShapeResize', 'PairedRandomResize',
    'PairedRandomChoiceResize', 'PairedRandomFlip', 'PairedRandomCrop',
    'PairedPad', 'ModalityTransform', 'PackPairedDetInputs', 'apply_paired'
]

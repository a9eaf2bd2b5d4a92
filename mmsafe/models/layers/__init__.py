"""Fusion modules and the building blocks of the MACL loss."""
from .contrastive import chance_ratio, pair_gap, symmetric_info_nce
from .fusion import (AddFusion, ConcatConvFusion, WeightedAddFusion,
                     build_fusions)
from .gather import gather_rows

__all__ = [
    'AddFusion', 'ConcatConvFusion', 'WeightedAddFusion', 'build_fusions',
    'gather_rows', 'symmetric_info_nce', 'chance_ratio', 'pair_gap'
]

"""What :class:`~mmsafe.engine.hooks.FirstBatchStatsHook` computes from the
first training batches, one concern per module:

* :mod:`.stats`: per-modality statistics and the flags of broken inputs;
* :mod:`.channels`: the channel mapping, mean and std the data
  preprocessor applied, recovered from its input and output;
* :mod:`.alignment`: the image-content alignment of the first pairs;
* :mod:`.display`: preprocessed images back to RGB for the visualizer.
"""
from .alignment import PairAlignment  # noqa: F401
from .channels import fit_channel_map  # noqa: F401
from .display import visualize_pairs  # noqa: F401
from .stats import (NEAR_CONSTANT_STD, analyse_batch,  # noqa: F401
                    make_flag, near_constant)

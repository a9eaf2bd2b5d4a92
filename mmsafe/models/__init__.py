"""mmsafe's models, laid out as MMDetection's: data preprocessors,
detectors, heads and layers (fusion, contrastive terms, gathering)."""
from .data_preprocessors import PairedDetDataPreprocessor  # noqa: F401
from .detectors import DualStreamFasterRCNN  # noqa: F401
from .heads import MACLHead  # noqa: F401
from .layers import AddFusion, ConcatConvFusion, WeightedAddFusion  # noqa: F401,E501

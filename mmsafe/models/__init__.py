"""Paired data preprocessor, dual-stream detector and the MACL head."""
from .paired_data_preprocessor import PairedDetDataPreprocessor  # noqa: F401
from .fusion import AddFusion, ConcatConvFusion, WeightedAddFusion  # noqa: F401,E501
from .macl_head import MACLHead  # noqa: F401
from .dual_stream_faster_rcnn import DualStreamFasterRCNN  # noqa: F401

"""Dual-modality detectors."""
from .dual_stream_faster_rcnn import DualStreamFasterRCNN

__all__ = ['DualStreamFasterRCNN']

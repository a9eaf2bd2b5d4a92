"""Heads of the dual-modality detectors."""
from .macl_head import MACLHead

__all__ = ['MACLHead']

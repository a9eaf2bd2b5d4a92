"""Data preprocessors for paired visible + infrared batches."""
from .paired_data_preprocessor import PairedDetDataPreprocessor

__all__ = ['PairedDetDataPreprocessor']

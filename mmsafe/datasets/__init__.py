"""Paired (visible + infrared) datasets, dataset wrappers and transforms."""

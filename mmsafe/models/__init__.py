"""Paired data preprocessor, dual-stream detector and the MACL head."""

"""NaN-skip optimizer wrappers."""

"""NaN-skip optimizer wrappers."""
from .nan_skip_optim_wrapper import NaNSkipOptimWrapper  # noqa: E402
from .amp_nan_skip_optim_wrapper import AmpNaNSkipOptimWrapper  # noqa: E402

__all__ = ['NaNSkipOptimWrapper', 'AmpNaNSkipOptimWrapper']

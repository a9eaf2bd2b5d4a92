"""Training-safety hooks and optimizer wrappers."""
from . import hooks  # noqa: F401
from . import optimizers  # noqa: F401

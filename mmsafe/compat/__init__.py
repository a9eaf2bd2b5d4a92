"""Version and platform shims, applied when mmsafe is imported."""
from .dist import install_cpu_ddp_support

install_cpu_ddp_support()

from .checkpoint import install_checkpoint_safety  # noqa: E402

install_checkpoint_safety()

from .remote_weights import install_remote_weights  # noqa: E402

install_remote_weights()

__all__ = ['install_cpu_ddp_support', 'install_checkpoint_safety',
           'install_remote_weights']

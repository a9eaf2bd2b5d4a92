"""Version and platform shims, applied when mmsafe is imported."""
from .dist import install_cpu_ddp_support

install_cpu_ddp_support()

__all__ = ['install_cpu_ddp_support']

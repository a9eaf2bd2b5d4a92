"""mmsafe: safe dual-modality (visible + infrared) detection training.

Importing this package registers every mmsafe component into MMDetection's
registries (``mmdet.registry``), so a config only needs::

    custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)
"""
from ._deps import check_dependencies

check_dependencies()

from .version import __version__  # noqa: E402
from . import compat  # noqa: E402,F401  (patches first: DDP on CPU, loading)
from . import datasets  # noqa: E402,F401
from . import models  # noqa: E402,F401
from . import engine  # noqa: E402,F401
from . import evaluation  # noqa: E402,F401
from .registry_help import mmsafe_registered_names  # noqa: E402

__all__ = ['__version__', 'mmsafe_registered_names']

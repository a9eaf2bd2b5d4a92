"""mmsafe: safe dual-modality (visible + infrared) detection training.

Importing this package registers every mmsafe component into MMDetection's
registries (``mmdet.registry``), ``SafeRunner`` into MMEngine's runner
registry and the ``atomic_local`` file backend into MMEngine's file
backends. It changes nothing else: behaviour comes from what a config
chooses (``runner_type='SafeRunner'``, hook and wrapper types), e.g. with
``configs/_base_/safety_runtime.py``::

    custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)
"""
from ._deps import check_dependencies

check_dependencies()

from .version import __version__  # noqa: E402
from . import checkpoint  # noqa: E402,F401
from . import datasets  # noqa: E402,F401
from . import models  # noqa: E402,F401
from . import engine  # noqa: E402,F401
from . import evaluation  # noqa: E402,F401
from .registry_help import mmsafe_registered_names  # noqa: E402

__all__ = ['__version__', 'mmsafe_registered_names']

"""mmsafe: safe dual-modality (visible + infrared) detection training.

Importing this package registers every mmsafe component in the registries
of its own scope, ``mmsafe`` (children of MMDetection's,
:mod:`mmsafe.registry`); its training machinery (``SafeRunner``, loops,
hooks, optim wrappers) also answers by plain name from MMDetection's scope
where the name is free, and the detection stack (``LLVIPDataset``,
``MACLHead`` ...) is ``mmsafe.<Name>`` there, so that a project's classes of
the same names keep theirs. It changes nothing else: behaviour comes from
what a config chooses (``runner_type='SafeRunner'``, hook and wrapper
types), e.g. with ``configs/_base_/safety_runtime.py``::

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
from .registry_help import (announce_scope,  # noqa: E402
                            mmsafe_registered_names)

announce_scope()

__all__ = ['__version__', 'mmsafe_registered_names']

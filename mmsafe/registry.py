"""The ``mmsafe`` registry scope: what configs read through ``mmsafe::``
build from.

mmsafe registers its components into MMDetection's registries
(``mmdet.registry``), so configs with ``default_scope = 'mmdet'`` find
them. A config that inherits from ``mmsafe::_base_/safety_runtime.py`` (or
any ``mmsafe::`` config) gets ``_scope_ = 'mmsafe'`` on every inherited
``dict(type=...)``, and MMEngine then builds it from the registries of
scope ``mmsafe``, imported from this module. Each registry here is an
empty child of MMDetection's, named the same: a lookup falls through to
MMDetection's (mmsafe's components, MMDetection's) and then MMEngine's,
as with ``default_scope = 'mmdet'``. Importing ``mmsafe`` does not import
this module; MMEngine does, the first time it builds in that scope.
"""
from mmengine.registry import Registry

from mmdet import registry as mmdet_registry

#: the scope name, the package name before ``::`` in a config path
SCOPE = 'mmsafe'


def _child(parent: Registry) -> Registry:
    # locations: a lookup in this scope first imports mmsafe (registration)
    return Registry(parent.name, parent=parent, scope=SCOPE,
                    locations=['mmsafe'])


RUNNERS = _child(mmdet_registry.RUNNERS)
RUNNER_CONSTRUCTORS = _child(mmdet_registry.RUNNER_CONSTRUCTORS)
LOOPS = _child(mmdet_registry.LOOPS)
HOOKS = _child(mmdet_registry.HOOKS)
DATASETS = _child(mmdet_registry.DATASETS)
DATA_SAMPLERS = _child(mmdet_registry.DATA_SAMPLERS)
TRANSFORMS = _child(mmdet_registry.TRANSFORMS)
MODELS = _child(mmdet_registry.MODELS)
MODEL_WRAPPERS = _child(mmdet_registry.MODEL_WRAPPERS)
WEIGHT_INITIALIZERS = _child(mmdet_registry.WEIGHT_INITIALIZERS)
OPTIMIZERS = _child(mmdet_registry.OPTIMIZERS)
OPTIM_WRAPPERS = _child(mmdet_registry.OPTIM_WRAPPERS)
OPTIM_WRAPPER_CONSTRUCTORS = _child(mmdet_registry.OPTIM_WRAPPER_CONSTRUCTORS)
PARAM_SCHEDULERS = _child(mmdet_registry.PARAM_SCHEDULERS)
METRICS = _child(mmdet_registry.METRICS)
EVALUATOR = _child(mmdet_registry.EVALUATOR)
TASK_UTILS = _child(mmdet_registry.TASK_UTILS)
VISUALIZERS = _child(mmdet_registry.VISUALIZERS)
VISBACKENDS = _child(mmdet_registry.VISBACKENDS)
LOG_PROCESSORS = _child(mmdet_registry.LOG_PROCESSORS)

"""mmsafe's registries: the scope ``mmsafe``, children of MMDetection's.

Every mmsafe component registers here (as mmyolo's register in the scope
``mmyolo``). Which names a config reaches how follows one rule, by the kind
of component:

* **mmsafe's training machinery** (:data:`MACHINERY`: the runner, loops,
  hooks, optim wrappers) also answers by its plain name from MMDetection's
  registries (``SafeRunner`` from MMEngine's, where MMDetection's
  ``tools/train.py`` builds ``runner_type`` without a scope), so a config
  with ``default_scope = 'mmdet'`` writes ``type='NaNSkipOptimWrapper'``.
  :func:`publish_machinery` adds each name there after mmsafe's modules
  are imported, unless the name is already taken (then it is left to the
  project that took it).
* **The detection stack** (datasets and dataset wrappers, transforms,
  models, metrics) stays in the ``mmsafe`` scope only: these are the
  field's common names (``LLVIPDataset``, ``MACLHead``,
  ``PairedDetDataPreprocessor``, ``LoadPairedImageFromFile`` ...), which an
  RGB-T project often registers in MMDetection's registries itself, before
  or after mmsafe is imported. A config reaches mmsafe's as
  ``type='mmsafe.LLVIPDataset'``, or with ``_scope_='mmsafe'`` in the dict,
  or with ``default_scope = 'mmsafe'`` (mmsafe's own configs). Inside an
  mmsafe component, the parts it builds (a dataset's pipeline, a
  detector's backbone and heads) are looked up in the ``mmsafe`` scope
  first (:func:`mmsafe_scope`), then MMDetection's and MMEngine's.

A lookup in the ``mmsafe`` scope falls through to MMDetection's registries
and then MMEngine's, as ``default_scope = 'mmdet'`` does. MMEngine imports
only the looked-up registry's own ``locations`` (here: mmsafe), not those
of its parents, so this module imports every MMDetection module that
registers (MMDetection's ``register_all_modules``, as mmyolo's scope does):
a name that MMDetection registers on demand (its visualizer, ...) is then
there too. Only MMEngine's and MMDetection's public API is used
(``parent``, ``scope``, ``locations``, ``register_module(force=False)``,
``DefaultScope``, ``register_all_modules``).
"""
import functools
import os
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from mmengine import registry as mmengine_registry
from mmengine.registry import DefaultScope, Registry

from mmdet import registry as mmdet_registry
from mmdet.utils import register_all_modules

register_all_modules(init_default_scope=False)

#: the scope name: ``mmsafe.X`` type names and ``mmsafe::`` config paths
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

#: mmsafe's registries whose names also answer from MMDetection's scope,
#: each with the registry they are published to: MMEngine's root runner
#: registry (MMDetection's tools/train.py builds ``runner_type`` there,
#: with no default scope), MMDetection's for the rest
MACHINERY: Tuple[Tuple[Registry, Registry], ...] = (
    (RUNNERS, mmengine_registry.RUNNERS),
    (LOOPS, mmdet_registry.LOOPS),
    (HOOKS, mmdet_registry.HOOKS),
    (OPTIM_WRAPPERS, mmdet_registry.OPTIM_WRAPPERS),
)

#: mmsafe's registries whose names stay in the ``mmsafe`` scope, each with
#: MMDetection's registry of the same kind (where a project's same-named
#: classes live)
STACK: Tuple[Tuple[Registry, Registry], ...] = (
    (DATASETS, mmdet_registry.DATASETS),
    (TRANSFORMS, mmdet_registry.TRANSFORMS),
    (MODELS, mmdet_registry.MODELS),
    (METRICS, mmdet_registry.METRICS),
)


@contextmanager
def mmsafe_scope() -> Iterator[None]:
    """Build inside this block in the ``mmsafe`` scope: a plain type name
    finds mmsafe's class first, then MMDetection's and MMEngine's.

    mmsafe's components wrap the building of their own parts in it, so
    that ``type='mmsafe.LLVIPDataset'`` in a config whose default scope is
    ``mmdet`` still builds mmsafe's paired transforms for its pipeline (a
    project's class of the same name is reached inside as ``mmdet.Name``).
    This is what MMEngine does for a config dict with ``_scope_``.
    """
    with DefaultScope.overwrite_default_scope(SCOPE):
        yield


def builds_in_mmsafe_scope(init: Callable) -> Callable:
    """Decorate an mmsafe component's ``__init__`` so that everything it
    builds is looked up in the ``mmsafe`` scope first
    (:func:`mmsafe_scope`)."""

    @functools.wraps(init)
    def wrapper(*args, **kwargs):
        with mmsafe_scope():
            return init(*args, **kwargs)

    return wrapper


def resolve(registry: Registry, name: str) -> Optional[type]:
    """The class that ``registry.build(dict(type=name))`` would build in
    the current default scope, or None when no registry there has it (an
    unknown ``scope.`` prefix included)."""
    with registry.switch_scope_and_registry(None) as scoped:
        try:
            return scoped.get(name)
        except KeyError:
            return None


def _owner(obj) -> str:
    return getattr(obj, '__module__', '?') or '?'


def _is_mmsafe(obj) -> bool:
    return _owner(obj).split('.')[0] == SCOPE


def publish_machinery() -> Dict[str, List[str]]:
    """Add mmsafe's machinery names to the registries that configs of the
    ``mmdet`` scope read (:data:`MACHINERY`), where they are free.

    Idempotent. Returns ``{registry name: [names left to the project]}``:
    the names another package had already registered there, which keep
    building that package's class (``mmsafe.Name`` builds mmsafe's).
    """
    left: Dict[str, List[str]] = {}
    for ours, target in MACHINERY:
        for name, cls in sorted(ours.module_dict.items()):
            taken = target.module_dict.get(name)
            if taken is None:
                target.register_module(name=name, module=cls)
            elif taken is not cls:
                left.setdefault(target.name, []).append(name)
    return left


def names_left_to_project() -> Dict[str, List[Tuple[str, str]]]:
    """mmsafe's names that, in MMDetection's scope, build another package's
    class: ``{registry name: [(name, that class's module)]}``.

    Covers both kinds of :data:`MACHINERY` and :data:`STACK`; a project
    that registers a name after mmsafe was imported is seen at the next
    call.
    """
    found: Dict[str, List[Tuple[str, str]]] = {}
    for ours, target in MACHINERY + STACK:
        for name in sorted(ours.module_dict):
            other = target.module_dict.get(name)
            if other is not None and not _is_mmsafe(other):
                found.setdefault(target.name, []).append(
                    (name, _owner(other)))
    return found


def scope_summary(left: Dict[str, List[Tuple[str, str]]]) -> str:
    """One line: which of mmsafe's names a project holds in the ``mmdet``
    scope, and how to reach mmsafe's own."""
    if not left:
        return ''
    parts = []
    for registry_name, entries in sorted(left.items()):
        names = ', '.join(f'{name} ({module})' for name, module in entries)
        parts.append(f'{registry_name}: {names}')
    return ('[mmsafe] these names belong to your project in the mmdet scope '
            'and build its classes there; mmsafe\'s own are '
            '`mmsafe.<Name>` (or `_scope_=\'mmsafe\'`, or '
            '`default_scope=\'mmsafe\'`): ' + '; '.join(parts))


def is_main_process_rank0() -> bool:
    """True outside DataLoader workers and on launcher rank 0 (``RANK``
    unset or ``0``): where the import line is printed."""
    import multiprocessing
    if multiprocessing.parent_process() is not None:
        return False
    return os.environ.get('RANK', '0') in ('', '0')

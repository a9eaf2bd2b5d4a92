"""Every ``type`` in the config resolves in the registry that builds it.

A typo in a type name otherwise surfaces only when that part is built: the
model at start-up, a hook at the first hook call, a val transform after the
first training epoch. The walk knows which registry each part of an MMEngine
/ MMDetection config is built from, and reports the key path of a name that
resolves nowhere together with the closest registered names.
"""
import difflib
import importlib
import re
from typing import Any, Iterator, List, Optional, Set, Tuple

from ..context import PreflightContext
from ..report import CheckRow

NAME = 'registry'

# Registries a model tree builds from, and the keys that switch to another.
_MODEL_FAMILY = ('MODELS', 'TASK_UTILS', 'WEIGHT_INITIALIZERS')
_TASK_KEYS = {
    'assigner', 'sampler', 'bbox_coder', 'prior_generator',
    'anchor_generator', 'point_generator', 'iou_calculator', 'match_cost',
    'match_costs', 'coder', 'iou_calc', 'bbox_sampler', 'bbox_assigner',
    'cost', 'costs'
}
# Model keys that MMDetection always builds through a registry: a name there
# that resolves nowhere is an error. Other nested keys may hold names that
# their parent interprets itself (FPG's ``dict(type='conv')``): a warning.
_STRICT_MODEL_KEY = re.compile(
    r'(^|_)(backbone|neck|head|loss|extractor|generator|coder|assigner|'
    r'sampler|preprocessor|detector|encoder|decoder|fusion|calculator|'
    r'norm_cfg|act_cfg|conv_cfg|init_cfg|model)(s?)$|^loss')
# Top-level keys that hold no buildable types.
_SKIP_TOP = {
    'default_scope', 'custom_imports', 'work_dir', 'load_from', 'resume',
    'launcher', 'log_level', 'env_cfg', 'randomness', 'auto_scale_lr',
    'backend_args', 'file_client_args', 'experiment_name', 'cfg', 'sync_bn',
    'find_unused_parameters', 'metainfo', 'classes'
}
# Per-section registry of the top-level keys.
_TOP = {
    'model': 'MODELS',
    'tta_model': 'MODELS',
    'data_preprocessor': 'MODELS',
    'tta_pipeline': 'TRANSFORMS',
    'train_cfg': 'LOOPS',
    'val_cfg': 'LOOPS',
    'test_cfg': 'LOOPS',
    'optim_wrapper': 'OPTIM_WRAPPERS',
    'param_scheduler': 'PARAM_SCHEDULERS',
    'val_evaluator': 'METRICS',
    'test_evaluator': 'METRICS',
    'visualizer': 'VISUALIZERS',
    'log_processor': 'LOG_PROCESSORS',
    'model_wrapper_cfg': 'MODEL_WRAPPERS',
    'custom_hooks': 'HOOKS',
    'default_hooks': 'HOOKS',
}
_ALL = ('MODELS', 'TASK_UTILS', 'WEIGHT_INITIALIZERS', 'DATASETS',
        'TRANSFORMS', 'DATA_SAMPLERS', 'FUNCTIONS', 'HOOKS', 'OPTIM_WRAPPERS',
        'OPTIMIZERS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'PARAM_SCHEDULERS',
        'METRICS', 'EVALUATOR', 'VISUALIZERS', 'VISBACKENDS',
        'LOG_PROCESSORS', 'LOOPS', 'MODEL_WRAPPERS', 'RUNNERS')
ANY = 'ANY'
DATALOADER = 'DATALOADER'


class _Finding:

    def __init__(self, path: str, name: str, expected: str,
                 found_in: Optional[str], suggestions: List[str],
                 strict: bool = True):
        self.strict = strict
        self.path = path
        self.name = name
        self.expected = expected
        self.found_in = found_in
        self.suggestions = suggestions


def _child_registry(registry: str, key: str, parent_type: Any) -> Optional[
        str]:
    """The registry that builds the value under ``key``; None: do not walk."""
    if registry == DATALOADER:
        return {
            'dataset': 'DATASETS',
            'sampler': 'DATA_SAMPLERS',
            'batch_sampler': 'DATA_SAMPLERS',
            'collate_fn': 'FUNCTIONS',
            'worker_init_fn': 'FUNCTIONS',
        }.get(key, ANY)
    if registry in _MODEL_FAMILY:
        if key == 'init_cfg' or registry == 'WEIGHT_INITIALIZERS':
            return 'WEIGHT_INITIALIZERS'
        if key in _TASK_KEYS:
            return 'TASK_UTILS'
        if key == 'roi_layer':
            return 'MMCV_OPS'  # resolved by name in mmcv.ops, not a registry
        if key == 'nms':
            return 'NMS'
        if key in ('pipeline', 'tta_pipeline'):
            return 'TRANSFORMS'
        return 'MODELS'
    if registry == 'DATASETS':
        if key in ('pipeline', 'transforms'):
            return 'TRANSFORMS'
        if key in ('dataset', 'datasets'):
            return 'DATASETS'
        return ANY
    if registry == 'TRANSFORMS':
        if parent_type == 'Albu':  # albumentations names, not mmdet's
            return None
        if key in ('transforms', 'transform', 'pipeline'):
            return 'TRANSFORMS'
        return ANY
    if registry == 'OPTIM_WRAPPERS':
        if key == 'optimizer':
            return 'OPTIMIZERS'
        if key == 'paramwise_cfg':
            return None
        return 'OPTIM_WRAPPERS'  # multi-optimizer dicts nest wrappers
    if registry == 'VISUALIZERS':
        return 'VISBACKENDS' if key == 'vis_backends' else ANY
    if registry in ('METRICS', 'EVALUATOR'):
        return 'METRICS' if key == 'metrics' else ANY
    if registry == 'HOOKS':
        return ANY
    return ANY


class _Walker:

    def __init__(self, ctx: PreflightContext):
        self.ctx = ctx
        self.checked = 0
        self.findings: List[_Finding] = []
        self._names_cache = {}

    # -- resolution ---------------------------------------------------------
    def _resolves(self, registry: str, name: str) -> bool:
        if registry == 'MMCV_OPS':
            try:
                from mmcv import ops
            except Exception:
                return True  # the dependency check reports a broken mmcv
            return hasattr(ops, name)
        if registry == 'NMS':
            try:  # batched_nms eval()s the name in this module
                nms_ops = importlib.import_module('mmcv.ops.nms')
            except Exception:
                return True
            return hasattr(nms_ops, name)
        return self.ctx.lookup(registry, name) is not None

    def _names(self, registry: str) -> List[str]:
        if registry not in self._names_cache:
            names: Set[str] = set()
            if registry in ('MMCV_OPS', 'NMS'):
                try:
                    from mmcv import ops
                    names = {n for n in dir(ops) if not n.startswith('_')}
                except Exception:
                    pass
            else:
                reg = self.ctx.registry(registry)
                reg.import_from_location()
                while reg is not None:
                    names |= set(reg.module_dict)
                    for child in reg.children.values():
                        names |= set(child.module_dict)
                    reg = reg.parent
            self._names_cache[registry] = sorted(names)
        return self._names_cache[registry]

    def _suggest(self, name: str, registries: Tuple[str, ...]) -> List[str]:
        names = sorted({n for r in registries for n in self._names(r)})
        lower = {n.lower(): n for n in names}
        short = name.split('.')[-1]
        close = difflib.get_close_matches(
            short.lower(), list(lower), n=3, cutoff=0.6)
        return [lower[c] for c in close]

    def check(self, path: str, name: Any, registry: str) -> None:
        """Check that ``name`` (found at ``path``) is a type of
        ``registry``; a finding otherwise."""
        if not isinstance(name, str):
            return  # a class or function object: resolved already
        self.checked += 1
        strict = registry != ANY
        if registry in _MODEL_FAMILY:
            # Some model parts take op names (nms, RoIAlign) under keys of
            # their own; accept those wherever they appear in a model.
            expected = _MODEL_FAMILY + ('NMS', 'MMCV_OPS')
            key = path.rsplit('.type', 1)[0].split('.')[-1].split('[')[0]
            strict = bool(_STRICT_MODEL_KEY.search(key)) or path == \
                'model.type'
        elif registry == ANY:
            expected = _ALL
        else:
            expected = (registry, )
        if any(self._resolves(r, name) for r in expected):
            return
        found_in = next((r for r in _ALL if r not in expected
                         and self._resolves(r, name)), None)
        suggest_from = tuple(r for r in expected if r not in ('NMS',
                                                               'MMCV_OPS'))
        self.findings.append(
            _Finding(path, name, registry, found_in,
                     self._suggest(name, suggest_from or expected), strict))

    # -- walk ---------------------------------------------------------------
    def walk(self, node: Any, path: str, registry: Optional[str],
             parent_type: Any = None) -> None:
        if registry is None:
            return
        if isinstance(node, (list, tuple)):
            for i, item in enumerate(node):
                self.walk(item, f'{path}[{i}]', registry, parent_type)
            return
        if not isinstance(node, dict):
            return
        own_type = node.get('type', None)
        if own_type is not None and registry != DATALOADER:
            if registry in ('METRICS', ) and own_type == 'Evaluator':
                registry = 'EVALUATOR'
            self.check(f'{path}.type', own_type, registry)
        if registry == 'OPTIM_WRAPPERS':
            constructor = node.get('constructor', None)
            if isinstance(constructor, str):
                self.check(f'{path}.constructor', constructor,
                            'OPTIM_WRAPPER_CONSTRUCTORS')
        for key, value in node.items():
            if key == 'type' or not isinstance(value, (dict, list, tuple)):
                continue
            self.walk(value, f'{path}.{key}',
                      _child_registry(registry, key, own_type), own_type)


def _top_registry(key: str) -> Optional[str]:
    """The registry of a top-level key; None for keys the Runner does not
    build. Helper variables (``train_pipeline``, ``detector``, ...) are
    checked where a section uses them; unused ones cannot break a run."""
    if key in _SKIP_TOP:
        return None
    if key in _TOP:
        return _TOP[key]
    if key.endswith('_dataloader'):
        return DATALOADER
    return None


def check_registry_types(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Resolve every ``type`` of the config in the registry that builds it."""
    walker = _Walker(ctx)
    cfg = ctx.cfg
    for key in cfg.keys():
        value = cfg[key]
        registry = _top_registry(key)
        if key == 'default_hooks' and isinstance(value, dict):
            for name, hook in value.items():
                walker.walk(hook, f'default_hooks.{name}', 'HOOKS')
            continue
        walker.walk(value, key, registry)
    runner_type = cfg.get('runner_type', None)
    if isinstance(runner_type, str):
        walker.check('runner_type', runner_type, 'RUNNERS')

    bad_sections = set()
    for f in walker.findings:
        if f.strict:
            bad_sections.add(f.path.split('.')[0].split('[')[0])
        hint = (f' Did you mean {" or ".join(repr(s) for s in f.suggestions)}?'
                if f.suggestions else '')
        where_else = (f' It is registered in {f.found_in}, which does not '
                      f'build this part of the config.' if f.found_in else '')
        registry = {'ANY': 'any registry', 'MMCV_OPS': 'mmcv.ops',
                    'NMS': 'mmcv.ops.nms'}.get(f.expected, f.expected)
        # Where the config does not say which registry builds a part (a
        # free-form argument), the name may not be a registry name at all:
        # warn only.
        status = 'error' if f.strict else 'warn'
        fix = (f'Correct the name{" (" + f.suggestions[0] + "?)" if f.suggestions else ""}, '  # noqa: E501
               "or import the package that registers it through "
               "custom_imports=dict(imports=[...], allow_failed_imports=False)"
               f" (scope {ctx.default_scope!r}).")
        yield CheckRow(status, NAME,
                       f'{f.name!r} is not in the {ctx.default_scope} '
                       f'{registry} registry.{hint}{where_else}', f.path, fix)
    ctx.state['registry_bad_sections'] = bad_sections
    if not walker.findings:
        yield CheckRow('ok', NAME, f'{walker.checked} type names resolve in '
                       f'their registries (scope {ctx.default_scope}).')

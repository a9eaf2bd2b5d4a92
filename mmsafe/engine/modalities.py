"""The run's modalities, read once per run: what every guard reads to find
the visible and infrared images, their files and the pairing-sensitive
loss terms (:mod:`mmsafe.modalities` holds the description itself).

Usage in a hook::

    from mmsafe.engine.modalities import modalities_of

    modalities = modalities_of(runner)          # any hook method
    images = modalities.images(MODEL_INPUTS, data)  # {'visible': [...], ...}
    modalities.losses                           # {'loss_contrast': 0.5}

The description is built at the first call of a run from, field by field:
the config's ``mmsafe_modalities``, then the ``mmsafe_modalities``
attribute of the model's components (mmsafe's own stack declares its
layout there), then recognition of the common layouts on the first batch
(:func:`mmsafe.modalities.recognise_images`). What was used, and where it
came from, is logged once per side and kept for the safety report
(:meth:`RunModalities.describe`). Recognition needs no collective: every
rank builds the same model from the same config and recognises the same
structure.
"""
import logging
from typing import Any, Dict, List, Optional, Tuple

from mmsafe.datasets.transforms.compose import PairedCompose
from mmsafe.datasets.walk import inner_datasets
from mmsafe.engine.run_context import run_context
from mmsafe.engine.utils import built_train_loop, unwrap_model
from mmsafe.events import log
from mmsafe.modalities import (BATCH_INPUTS, DICT_KEYS, FIELDS, INFRARED,
                               MODALITIES, MODEL_INPUTS, RECOGNISED_LOSSES,
                               SAMPLE_FIELDS, VISIBLE, ImagePath,
                               check_declaration, is_infonce_name,
                               recognise_files, recognise_images,
                               use_declared_files)

#: the config key of the declaration
CONFIG_KEY = 'mmsafe_modalities'
#: the class attribute by which a component declares its part
COMPONENT_ATTR = 'mmsafe_modalities'

DECLARE_HINT = (
    "declare it in the config: mmsafe_modalities = dict(model_inputs=dict("
    "visible='inputs.<key>', infrared='inputs.<key>'), ...) (see "
    'docs/user_guides/existing_project.md)')


def looked_for() -> str:
    """What recognition looks for, in words (for the guards' messages)."""
    return (f'a dict key {list(DICT_KEYS[INFRARED])}, a list of two, one '
            f'tensor of 6/4/2 channels, a data-sample field '
            f'{list(SAMPLE_FIELDS)}')


def _component_declarations(model: Any) -> List[Tuple[str, Dict]]:
    """``(class name, declaration)`` of the model's components that
    declare their part, the data preprocessor first."""
    found, seen = [], set()
    modules = []
    pre = getattr(model, 'data_preprocessor', None)
    if pre is not None:
        modules.append(pre)
    if hasattr(model, 'modules'):
        modules += list(model.modules())
    for module in modules:
        if id(module) in seen:
            continue
        seen.add(id(module))
        declared = getattr(type(module), COMPONENT_ATTR, None)
        if isinstance(declared, dict):
            name = type(module).__name__
            found.append((name, check_declaration(
                declared, f'{name}.{COMPONENT_ATTR}')))
    return found


class RunModalities:
    """What a run declared about its modalities, and what was recognised.

    Args:
        declared (dict, optional): the config's ``mmsafe_modalities``.
        components (list, optional): ``(class name, declaration)`` of the
            model's components (:data:`COMPONENT_ATTR`).

    Attributes:
        fields (dict): field -> value, merged (the config wins).
        sources (dict): field -> where its value came from
            (``'config mmsafe_modalities'``, ``'<Class>.mmsafe_modalities'``).
    """

    def __init__(self, declared: Optional[Dict] = None,
                 components: Optional[List[Tuple[str, Dict]]] = None
                 ) -> None:
        self.fields: Dict[str, Any] = {}
        self.sources: Dict[str, str] = {}
        for name, part in reversed(components or []):
            for field, value in part.items():
                self._set(field, value, f'{name}.{COMPONENT_ATTR}')
        for field, value in check_declaration(declared).items():
            self._set(field, value, f'config {CONFIG_KEY}')
        # side -> {'visible': ImagePath or None, 'infrared': ...}
        self._paths: Dict[str, Dict[str, Optional[ImagePath]]] = {}
        self._how: Dict[str, str] = {}
        self._failed: Dict[str, str] = {}
        self._files: Optional[Dict[str, Optional[str]]] = None
        use_declared_files(self.fields.get('files'))

    def _set(self, field: str, value: Any, source: str) -> None:
        if field in ('files', 'results', MODEL_INPUTS, BATCH_INPUTS) and \
                isinstance(self.fields.get(field), dict):
            # per modality: the later source wins where it says something
            merged = dict(self.fields[field])
            merged.update({k: v for k, v in value.items() if v is not None})
            value = merged
        self.fields[field] = value
        self.sources[field] = source

    # ---------------------------------------------------------- images --
    def images(self, side: str, data: Any) -> Dict[str, List[Any]]:
        """The images of a batch per modality, one ``[C, H, W]`` tensor
        per sample: ``{'visible': [...], 'infrared': [...]}``, or
        ``{'img': [...]}`` when only one image is found, or ``{}`` when
        none.

        Args:
            side (str): :data:`~mmsafe.modalities.MODEL_INPUTS` (``data``
                is the data preprocessor's output) or
                :data:`~mmsafe.modalities.BATCH_INPUTS` (its input).
            data (dict): ``dict(inputs=..., data_samples=[...])``.
        """
        paths = self._paths.get(side)
        if paths is None:
            paths = self._settle(side, data)
        found = {}
        for name in MODALITIES:
            path = paths.get(name)
            images = path.resolve(data) if path is not None else None
            if images is not None:
                found[name] = images
        if INFRARED not in found and VISIBLE in found:
            return {'img': found[VISIBLE]}
        return found

    def paired(self, side: str) -> Optional[bool]:
        """Whether both images were found on ``side`` (None: not looked
        at yet)."""
        paths = self._paths.get(side)
        if paths is None:
            return None
        return paths.get(INFRARED) is not None and \
            paths.get(VISIBLE) is not None

    def _settle(self, side: str, data: Any) -> Dict[str, Optional[ImagePath]]:
        declared = self.fields.get(side) or {}
        recognised, how = recognise_images(data)
        paths: Dict[str, Optional[ImagePath]] = {}
        origin = {}
        for name in MODALITIES:
            if declared.get(name):
                paths[name] = ImagePath(declared[name])
                origin[name] = self.sources[side]
            elif recognised and recognised.get(name):
                paths[name] = ImagePath(recognised[name])
                origin[name] = f'recognised: {how}'
            else:
                paths[name] = None
        self._paths[side] = paths
        if paths[VISIBLE] is None or paths[INFRARED] is None:
            self._failed[side] = how
        same = len(set(origin.values())) == 1 and len(origin) == 2
        shown = ', '.join(f'{n}={paths[n] if paths[n] else "not found"}'
                          + (f' ({origin[n]})' if n in origin and not same
                             else '') for n in MODALITIES) + (
            f' ({next(iter(origin.values()))})' if same else '')
        self._how[side] = shown
        # where each image is, once per side; a guard that needs the
        # infrared image says what to declare when it is not found
        log(f'modalities: {side.replace("_", " ")}: {shown}', logging.INFO)
        return paths

    def not_found(self, side: str) -> Optional[str]:
        """What was seen on ``side`` when an image was not found there."""
        return self._failed.get(side)

    # ----------------------------------------------------------- files --
    def files(self, meta: Optional[dict]) -> Dict[str, Optional[str]]:
        """The meta keys of the two files (declared, else recognised on
        the first sample seen)."""
        if self._files is None:
            declared = self.fields.get('files') or {}
            found = recognise_files(meta)
            self._files = {n: declared.get(n) or found[n]
                           for n in MODALITIES}
        return self._files

    # ---------------------------------------------------------- losses --
    @property
    def losses(self) -> Optional[Dict[str, Optional[float]]]:
        """The declared pairing-sensitive terms (name -> weight already
        applied, None when not given), or None when nothing declares
        any (then :data:`~mmsafe.modalities.RECOGNISED_LOSSES` are
        watched for)."""
        return self.fields.get('losses')

    def loss_names(self) -> Tuple[List[str], bool]:
        """``(names, declared)``: the declared terms, else the recognised
        names."""
        if self.losses:
            return list(self.losses), True
        return list(RECOGNISED_LOSSES), False

    def chance_term(self, names: List[str]) -> Optional[str]:
        """The InfoNCE term whose chance level is judged: ``chance`` as
        declared (False: none), else the first of ``names`` named like
        one (:func:`~mmsafe.modalities.is_infonce_name`)."""
        chance = self.fields.get('chance')
        if chance is False:
            return None
        if isinstance(chance, str):
            return chance
        return next((n for n in names if is_infonce_name(n)), None)

    @property
    def num_pairs(self) -> Optional[int]:
        """Declared InfoNCE candidates per query, or None."""
        return self.fields.get('num_pairs')

    # ---------------------------------------------------------- report --
    def describe(self) -> Dict[str, Any]:
        """What the report keeps: each field's value and source, and what
        was recognised on each side."""
        out: Dict[str, Any] = dict(
            declared={f: dict(value=self.fields[f], source=self.sources[f])
                      for f in FIELDS if f in self.fields})
        for side in (BATCH_INPUTS, MODEL_INPUTS):
            out[side] = self._how.get(side, 'no batch seen')
        out['files'] = self._files
        return out


def modalities_of(runner) -> RunModalities:
    """The run's :class:`RunModalities`, built at the first call from the
    config's ``mmsafe_modalities`` and the model's components.

    Raises:
        MMSafeValueError: the declaration is malformed (named).
    """
    context = run_context(runner)
    found = getattr(context, 'modalities', None)
    if isinstance(found, RunModalities):
        return found
    cfg = getattr(runner, 'cfg', None)
    declared = cfg.get(CONFIG_KEY) if hasattr(cfg, 'get') else None
    if hasattr(declared, 'to_dict'):
        declared = declared.to_dict()
    model = getattr(runner, 'model', None)
    components = _component_declarations(unwrap_model(model)) \
        if model is not None else []
    context.modalities = RunModalities(declared, components)
    return context.modalities


def train_datasets(runner) -> List[Any]:
    """The training dataset and every dataset it wraps (empty when the
    training loop or its loader is not built)."""
    loader = getattr(built_train_loop(runner), 'dataloader', None)
    dataset = getattr(loader, 'dataset', None)
    found, stack, seen = [], [dataset] if dataset is not None else [], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        found.append(node)
        stack.extend(inner_datasets(node))
    return found


def pipeline_geometry(runner) -> Tuple[bool, str]:
    """Whether the training pipeline records each modality's geometry
    (mmsafe's :class:`~mmsafe.datasets.transforms.PairedCompose`, which
    refuses a pair whose two geometries differ, naming the transform).

    Returns:
        tuple: ``(recorded, what)``: ``what`` names the pipeline class
        found (or why none was found).
    """
    datasets = train_datasets(runner)
    if not datasets:
        return False, 'no training dataset'
    names = []
    for node in datasets:
        pipeline = getattr(node, 'pipeline', None)
        if isinstance(pipeline, PairedCompose):
            return True, type(pipeline).__name__
        if pipeline is not None:
            names.append(f'{type(node).__name__}.pipeline '
                         f'({type(pipeline).__name__})')
    return False, ', '.join(names) or f'{type(datasets[0]).__name__} (no ' \
        'pipeline)'


def infrared_results_key(modalities: RunModalities) -> str:
    """Where the pipeline keeps the infrared image, for messages:
    ``results['<key>']`` as declared, else in words."""
    declared = (modalities.fields.get('results') or {}).get(INFRARED)
    return f'results[{declared!r}]' if declared else \
        "the pipeline's results"

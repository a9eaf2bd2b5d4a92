"""Where a run's visible and infrared images, their files and its
pairing-sensitive loss terms are: the one description every guard reads.

A project declares it in its config (read once per run,
:mod:`mmsafe.engine.modalities`)::

    mmsafe_modalities = dict(
        # what the model receives: the data preprocessor's output
        model_inputs=dict(visible='inputs.rgb', infrared='inputs.lwir'),
        # what the data preprocessor receives (the pipeline's packed batch)
        batch_inputs=dict(visible='inputs',
                          infrared='data_samples.infrared_img'),
        # keys of the pipeline's results dict (named in the guards'
        # messages: a pipeline's results are not seen at run time)
        results=dict(visible='img', infrared='img_lwir'),
        # meta keys of the data samples that name the two files
        files=dict(visible='img_path', infrared='lwir_path'),
        # pairing-sensitive loss terms, each with the weight it already
        # carries (a list of names: weight 1)
        losses=dict(loss_contrast=0.5),
        # the InfoNCE term whose chance level is judged (default: the first
        # term named *macl*, *contrast* or *nce*; False: none)
        chance='loss_contrast',
        # candidates each InfoNCE query is compared with (default: the
        # MACL head's, else the batch size)
        num_pairs=None)

Every field is optional. A component may declare its part the same way,
as a ``mmsafe_modalities`` dict attribute of its class (mmsafe's
``PairedDetDataPreprocessor`` and ``MACLHead`` do); the config wins over
it. What neither declares is recognised from the common layouts
(:func:`recognise_images`, :func:`recognise_files`,
:data:`RECOGNISED_LOSSES`).

An image location is a path into a batch ``dict(inputs=...,
data_samples=[...])``:

* ``inputs``: the whole ``inputs``;
* ``.name``: a key of a dict (``inputs.infrared``);
* ``[i]``: an item of a list or tuple (``inputs[1]``);
* ``[a:b]``: channels ``a`` to ``b`` of each image (``inputs[3:6]`` of
  one 6-channel tensor, ``inputs[3:4]`` of a 4-channel one);
* ``data_samples.name``: a field (or meta key) of each data sample
  (``data_samples.infrared_img``).

A loss name matches a logged key equal to it or ending in ``.name`` or
``/name`` (a prefix such as ``s0.`` or ``roi.``); nested dicts are read
with dotted keys. A name with ``*`` or ``?`` is a glob pattern.

This module imports nothing from mmsafe but :mod:`mmsafe.errors`: the event
helpers and the optimizer wrappers name files through it.
"""
import fnmatch
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmsafe.errors import MMSafeValueError

VISIBLE, INFRARED = 'visible', 'infrared'
MODALITIES = (VISIBLE, INFRARED)
#: the fields of a declaration
FIELDS = ('model_inputs', 'batch_inputs', 'results', 'files', 'losses',
          'chance', 'num_pairs')
#: the two places images are found in a training step
MODEL_INPUTS, BATCH_INPUTS = 'model_inputs', 'batch_inputs'
SIDES = (MODEL_INPUTS, BATCH_INPUTS)

#: the dict keys recognised per modality, in order
DICT_KEYS = {VISIBLE: ('visible', 'vis', 'rgb', 'img'),
             INFRARED: ('infrared', 'ir', 'lwir', 'thermal', 'tir')}
#: data-sample fields recognised as the infrared image
SAMPLE_FIELDS = ('infrared_img', 'ir_img', 'img_lwir', 'lwir_img', 'img_ir',
                 'thermal_img')
#: data-sample meta keys recognised as the files per modality
FILE_KEYS = {VISIBLE: ('img_path', ),
             INFRARED: ('ir_img_path', 'ir_path', 'infrared_path',
                        'infrared_img_path', 'lwir_path', 'img_lwir_path',
                        'thermal_path')}
#: loss names recognised as pairing-sensitive
RECOGNISED_LOSSES = ('loss_macl', 'loss_contrast', 'loss_align')
#: a loss name with one of these is an InfoNCE term (chance level judged)
CHANCE_WORDS = ('macl', 'contrast', 'nce')
#: channel counts of one tensor holding both modalities: visible channels,
#: infrared channels
STACKED_CHANNELS = {6: ((0, 3), (3, 6)), 4: ((0, 3), (3, 4)),
                    2: ((0, 1), (1, 2))}

_STEP = re.compile(r'\.([A-Za-z_][A-Za-z0-9_]*)|\[(-?\d+)\]|\[(\d*):(\d*)\]')


# --------------------------------------------------------------- paths --
class ImagePath:
    """A parsed image location (see the module docstring).

    Args:
        text (str): e.g. ``'inputs.infrared'``, ``'inputs[3:6]'``,
            ``'data_samples.infrared_img'``.

    Raises:
        MMSafeValueError: the text is not such a path.
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise MMSafeValueError(
                f'[mmsafe] an image location is a string such as '
                f"'inputs.infrared', got {text!r}")
        self.text = text
        if text.startswith('data_samples.'):
            field = text[len('data_samples.'):]
            if not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', field):
                raise self._error()
            self.root, self.field, self.steps = 'data_samples', field, ()
            return
        if not (text == 'inputs' or text.startswith(('inputs.', 'inputs['))):
            raise self._error()
        rest = text[len('inputs'):]
        steps, pos = [], 0
        while pos < len(rest):
            match = _STEP.match(rest, pos)
            if match is None:
                raise self._error()
            key, index, start, stop = match.groups()
            if key is not None:
                steps.append(('key', key))
            elif index is not None:
                steps.append(('index', int(index)))
            else:
                steps.append(('channels', int(start or 0),
                              int(stop) if stop else None))
            pos = match.end()
        self.root, self.field, self.steps = 'inputs', None, tuple(steps)

    def _error(self) -> MMSafeValueError:
        return MMSafeValueError(
            f'[mmsafe] {self.text!r} is not an image location: write '
            "'inputs', 'inputs.<key>', 'inputs[<i>]', 'inputs[<a>:<b>]' "
            "(channels) or 'data_samples.<field>'")

    def __repr__(self) -> str:
        return self.text

    def resolve(self, data: Any) -> Optional[List[Any]]:
        """The images at this location in ``data`` (a batch dict), one per
        sample (a ``[C, H, W]`` tensor each; a batched tensor is split
        along its first dimension, views only), or None when the batch
        has nothing there."""
        if not isinstance(data, dict):
            return None
        if self.root == 'data_samples':
            found = [sample_field(s, self.field)
                     for s in data.get('data_samples') or []]
            if not found or any(f is None for f in found):
                return None
            return [_chw(f) for f in found]
        node = data.get('inputs')
        for step in self.steps:
            node = _step(node, step)
            if node is None:
                return None
        return per_sample(node)


def _step(node: Any, step: tuple) -> Any:
    kind = step[0]
    if kind == 'key':
        return node.get(step[1]) if isinstance(node, dict) else None
    if kind == 'index':
        if isinstance(node, (list, tuple)) and -len(node) <= step[1] < len(
                node):
            return node[step[1]]
        return None
    start, stop = step[1], step[2]
    if _is_tensor(node) and node.dim() == 4:
        return node[:, start:stop] if node.shape[1] >= (stop or 0) else None
    images = per_sample(node)
    if images is None or any(img.dim() != 3 or img.shape[0] < (stop or 0)
                             for img in images):
        return None
    return [img[start:stop] for img in images]


def _is_tensor(value: Any) -> bool:
    return hasattr(value, 'dim') and hasattr(value, 'shape')


def _chw(value: Any) -> Any:
    """A data-sample image as a ``[C, H, W]`` tensor (an ``H x W (x C)``
    array is converted; a tensor is kept)."""
    if _is_tensor(value):
        return value if value.dim() == 3 else value[None]
    import numpy as np
    import torch
    arr = np.asarray(value)
    if arr.ndim == 2:
        arr = arr[..., None]
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))


def per_sample(node: Any) -> Optional[List[Any]]:
    """``node`` as one ``[C, H, W]`` image per sample: a batched
    ``[B, C, H, W]`` tensor, or a list/tuple of ``[C, H, W]`` tensors;
    None otherwise."""
    if _is_tensor(node):
        return list(node.unbind(0)) if node.dim() == 4 else None
    if isinstance(node, (list, tuple)) and node and all(
            _is_tensor(x) and x.dim() == 3 for x in node):
        return list(node)
    return None


def sample_field(sample: Any, name: str) -> Any:
    """Field ``name`` of a data sample (an attribute, or a meta key)."""
    value = getattr(sample, name, None)
    if value is None:
        meta = getattr(sample, 'metainfo', None)
        if isinstance(meta, dict):
            value = meta.get(name)
    return value


# --------------------------------------------------------- recognition --
def _channels(node: Any) -> Optional[int]:
    if _is_tensor(node) and node.dim() == 4:
        return int(node.shape[1])
    images = per_sample(node)
    return int(images[0].shape[0]) if images else None


def _modality_list(node: Any) -> bool:
    return (_is_tensor(node) and node.dim() == 4) or (
        isinstance(node, (list, tuple)) and bool(node) and all(
            _is_tensor(x) and x.dim() == 3 for x in node))


def recognise_images(data: Any) -> Tuple[Optional[Dict[str, Optional[str]]],
                                         str]:
    """Recognise where the two images are in a batch.

    Recognised, in this order: ``inputs`` a dict with a visible and an
    infrared key (:data:`DICT_KEYS`); a list or tuple of two image lists
    or batched tensors; one tensor of 6, 4 or 2 channels
    (:data:`STACKED_CHANNELS`); 3 or 1 channels with the infrared image in
    a data-sample field (:data:`SAMPLE_FIELDS`); 3 or 1 channels alone (a
    single modality: ``infrared`` None).

    Args:
        data (dict): ``dict(inputs=..., data_samples=[...])``.

    Returns:
        tuple: ``({'visible': path, 'infrared': path or None}, how)`` with
        ``how`` in words, or ``(None, what was found)``.
    """
    if not isinstance(data, dict) or 'inputs' not in data:
        return None, 'no inputs'
    inputs = data['inputs']
    samples = data.get('data_samples') or []
    if isinstance(inputs, dict):
        vis = next((k for k in DICT_KEYS[VISIBLE] if k in inputs), None)
        ir = next((k for k in DICT_KEYS[INFRARED] if k in inputs), None)
        if vis and ir:
            return (dict(visible=f'inputs.{vis}', infrared=f'inputs.{ir}'),
                    f'a dict of {vis!r} and {ir!r}')
        return None, f'a dict of {sorted(inputs)}'
    if isinstance(inputs, (list, tuple)) and len(inputs) == 2 and all(
            _modality_list(x) for x in inputs):
        return (dict(visible='inputs[0]', infrared='inputs[1]'),
                'a list of two images per sample')
    channels = _channels(inputs)
    if channels in STACKED_CHANNELS:
        (a, b), (c, d) = STACKED_CHANNELS[channels]
        return (dict(visible=f'inputs[{a}:{b}]', infrared=f'inputs[{c}:{d}]'),
                f'one {channels}-channel tensor (visible {a}-{b - 1}, '
                f'infrared {c}-{d - 1})')
    if channels in (1, 3):
        field = next((f for f in SAMPLE_FIELDS if samples and all(
            sample_field(s, f) is not None for s in samples)), None)
        if field is not None:
            return (dict(visible='inputs',
                         infrared=f'data_samples.{field}'),
                    f'{channels}-channel inputs, infrared in the data '
                    f'samples\' {field!r}')
        return (dict(visible='inputs', infrared=None),
                f'{channels}-channel inputs and no infrared image')
    return None, f'inputs of type {type(inputs).__name__}' + (
        f' with {channels} channels' if channels else '')


def recognise_files(meta: Optional[dict]) -> Dict[str, Optional[str]]:
    """The meta keys of the two files in a data sample's metainfo (the
    first of :data:`FILE_KEYS` present per modality; None when none)."""
    meta = meta or {}
    return {name: next((k for k in FILE_KEYS[name] if meta.get(k)), None)
            for name in MODALITIES}


def flatten(losses: Any, prefix: str = '') -> Dict[str, Any]:
    """A loss dict with nested dicts as dotted keys."""
    flat: Dict[str, Any] = {}
    if not isinstance(losses, dict):
        return flat
    for key, value in losses.items():
        name = f'{prefix}{key}'
        if isinstance(value, dict):
            flat.update(flatten(value, name + '.'))
        else:
            flat[name] = value
    return flat


def loss_key_matches(name: str, key: str) -> bool:
    """Whether a declared loss ``name`` matches a logged ``key``: equal,
    the key's last dotted or slashed part, or a glob pattern."""
    if any(c in name for c in '*?['):
        return fnmatch.fnmatchcase(key, name)
    return key == name or key.endswith('.' + name) or key.endswith('/' +
                                                                   name)


def find_loss_key(name: str, keys: Sequence[str]) -> Optional[str]:
    """The first of ``keys`` that ``name`` matches, or None."""
    return next((k for k in keys if loss_key_matches(name, k)), None)


def is_infonce_name(name: str) -> bool:
    """Whether a loss name reads as an InfoNCE (contrastive) term."""
    low = name.lower()
    return any(word in low for word in CHANCE_WORDS)


# --------------------------------------------------------- declaration --
def _check_images(field: str, value: Any) -> Dict[str, Optional[str]]:
    if not isinstance(value, dict) or not set(value) <= set(MODALITIES):
        raise MMSafeValueError(
            f'[mmsafe] mmsafe_modalities.{field} is a dict with the keys '
            f"'visible' and 'infrared', got {value!r}")
    out = {}
    for name in MODALITIES:
        if value.get(name) is not None:
            try:  # validated here, at start-up
                ImagePath(value[name])
            except MMSafeValueError as err:
                raise MMSafeValueError(
                    f'[mmsafe] mmsafe_modalities.{field}.{name}: '
                    f'{str(err).replace("[mmsafe] ", "", 1)}') from err
        out[name] = value.get(name)
    return out


def _check_keys(field: str, value: Any) -> Dict[str, Optional[str]]:
    if not isinstance(value, dict) or not set(value) <= set(MODALITIES) or \
            not all(v is None or isinstance(v, str) for v in value.values()):
        raise MMSafeValueError(
            f'[mmsafe] mmsafe_modalities.{field} is a dict of key names '
            f"with the keys 'visible' and 'infrared', got {value!r}")
    return dict(value)


def _check_losses(value: Any) -> Dict[str, Optional[float]]:
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)):
        value = {name: None for name in value}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, (int, float)))
            for k, v in value.items()):
        raise MMSafeValueError(
            '[mmsafe] mmsafe_modalities.losses is a list of loss names or '
            "a dict of loss name -> the weight it already carries, e.g. "
            f"dict(loss_contrast=0.5); got {value!r}")
    return {k: None if v is None else float(v) for k, v in value.items()}


def check_declaration(declared: Any, where: str = 'mmsafe_modalities'
                      ) -> Dict[str, Any]:
    """Validate a declaration; returns it with its fields normalised
    (``losses`` as a dict name -> weight or None).

    Raises:
        MMSafeValueError: an unknown field or a malformed value, named.
    """
    if declared is None:
        return {}
    if not isinstance(declared, dict):
        raise MMSafeValueError(f'[mmsafe] {where} is a dict, got '
                               f'{type(declared).__name__}')
    unknown = sorted(set(declared) - set(FIELDS))
    if unknown:
        raise MMSafeValueError(
            f'[mmsafe] {where} has unknown field(s) {unknown}; the fields '
            f'are {list(FIELDS)}')
    out: Dict[str, Any] = {}
    for field, value in declared.items():
        if field in SIDES:
            out[field] = _check_images(field, value)
        elif field in ('results', 'files'):
            out[field] = _check_keys(field, value)
        elif field == 'losses':
            out[field] = _check_losses(value)
        elif field == 'chance':
            if value is not None and value is not False and not isinstance(
                    value, str):
                raise MMSafeValueError(
                    '[mmsafe] mmsafe_modalities.chance is a loss name, or '
                    f'False for none; got {value!r}')
            out[field] = value
        else:  # num_pairs
            if value is not None and (not isinstance(value, int)
                                      or value < 1):
                raise MMSafeValueError(
                    '[mmsafe] mmsafe_modalities.num_pairs is a positive '
                    f'int; got {value!r}')
            out[field] = value
    return out


# -------------------------------------------------- files of a sample --
_DECLARED_FILES: Dict[str, Optional[str]] = {}


def use_declared_files(files: Optional[Dict[str, Optional[str]]]) -> None:
    """Name files with these meta keys from now on in this process (the
    run's declaration; None: recognise them per sample)."""
    _DECLARED_FILES.clear()
    _DECLARED_FILES.update({k: v for k, v in (files or {}).items() if v})


def sample_files(meta: Optional[dict]) -> Tuple[Optional[str],
                                                Optional[str]]:
    """``(visible file, infrared file)`` of a data sample's metainfo, by
    the run's declared meta keys, else by :data:`FILE_KEYS`."""
    meta = meta or {}
    found = recognise_files(meta)
    keys = {name: _DECLARED_FILES.get(name) or found[name]
            for name in MODALITIES}
    return tuple(meta.get(keys[name]) if keys[name] else None
                 for name in MODALITIES)

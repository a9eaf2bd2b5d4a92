"""Images of more than 8 bits per channel: read their real depth, then keep
it by a documented rule, or refuse them naming the rule.

Radiometric thermal frames (FLIR ADAS's 16-bit TIFFs, many self-recorded
sets) hold raw sensor counts such as 51,300-52,150. OpenCV's colour and
grey decodes (``color_type='color'``/``'grayscale'``) keep the high byte
of a 16-bit file: those frames reach the model as 3 grey levels, without
a word. The paired loader therefore reads every file's depth from its
header first (:func:`file_bit_depth`: nothing is decoded; an 8-bit file is
decoded exactly as before) and a deeper file is decoded with its full
depth (:func:`read_high_depth`) and then either

* mapped to the 0-255 range the model's normalisation expects, as float32,
  by the rule the config names (``high_depth=dict(rule=...)``,
  :func:`normalise`):

  - ``'percentile'``: each image's ``low``-th to ``high``-th percentile
    (defaults 1 and 99) to 0-255, clipped;
  - ``'minmax'``: each image's minimum to maximum to 0-255;
  - ``'fixed'``: the dataset-wide ``low`` to ``high`` (raw values, e.g.
    the range ``tools/check_dataset.py --stats`` reports) to 0-255,
    clipped: the same count is the same value in every image;
  - ``'raw'``: the counts as they are, as float32 (the preprocessor's
    ``mean``/``std`` must then be in counts; ``--stats`` prints them);
    ``color_type='unchanged'`` without a rule reads this way;

* or, without a rule, refused with an error that names the file, its
  depth and range, and these rules.

What was done is recorded per modality in the results' ``bit_depth``
(and the data sample's meta): the file's bits, its minimum and maximum,
the rule and the ``low``/``high`` mapped to 0 and 255.
"""
from io import BytesIO
from typing import Optional, Tuple

import cv2
import numpy as np

from mmsafe.errors import MMSafeValueError

HIGH_DEPTH_RULES = ('percentile', 'minmax', 'fixed', 'raw')
#: the percentile rule's default range
DEFAULT_PERCENTILES = (1.0, 99.0)
#: results / meta key of the record
BIT_DEPTH_KEY = 'bit_depth'

_JPEG_MAGIC = b'\xff\xd8\xff'
_PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
#: PIL modes of at most 8 bits per channel
_PIL_8BIT_MODES = frozenset(('1', 'L', 'P', 'RGB', 'RGBA', 'RGBX', 'CMYK',
                             'YCbCr', 'LA', 'PA', 'La', 'RGBa', 'HSV',
                             'LAB'))
#: PIL modes of more bits, and how many
_PIL_DEEP_MODES = {'I;16': 16, 'I;16B': 16, 'I;16L': 16, 'I;16N': 16,
                   'I;16S': 16, 'I': 32, 'F': 32}
_TIFF_BITS_PER_SAMPLE = 258


def file_bit_depth(img_bytes: bytes) -> int:
    """Bits per channel that an encoded image stores, from its header.

    JPEG: 8; PNG: its IHDR bit depth (below 8 counts as 8, as OpenCV reads
    it); TIFF: its BitsPerSample; other formats: PIL's mode, or, where PIL
    cannot tell, OpenCV's unchanged decode. An undecodable file counts as
    8 bits (the decode that follows reports it).
    """
    if img_bytes[:3] == _JPEG_MAGIC:
        return 8
    if img_bytes[:8] == _PNG_MAGIC and len(img_bytes) >= 26 and \
            img_bytes[12:16] == b'IHDR':
        return max(8, img_bytes[24])
    try:
        from PIL import Image
        with Image.open(BytesIO(img_bytes)) as img:
            if img.format == 'TIFF':
                bits = img.tag_v2.get(_TIFF_BITS_PER_SAMPLE, 8)
                bits = bits if isinstance(bits, (tuple, list)) else (bits, )
                return max(8, *[int(b) for b in bits])
            if img.mode in _PIL_8BIT_MODES:
                return 8
            if img.mode in _PIL_DEEP_MODES:
                return _PIL_DEEP_MODES[img.mode]
    except Exception:  # noqa: BLE001  PIL cannot tell; OpenCV decides
        pass
    img = cv2.imdecode(np.frombuffer(img_bytes, np.uint8),
                       cv2.IMREAD_UNCHANGED)
    return 8 if img is None else max(8, img.dtype.itemsize * 8)


def check_high_depth_cfg(cfg: Optional[dict], owner: str) -> Optional[dict]:
    """Validate a ``high_depth`` option; return it with its defaults.

    Args:
        cfg (dict, optional): ``dict(rule=..., low=..., high=...)`` (see
            the module docstring); None: refuse deeper images.
        owner (str): the transform, named in the errors.
    """
    if cfg is None:
        return None
    if not isinstance(cfg, dict) or cfg.get('rule') not in HIGH_DEPTH_RULES:
        raise MMSafeValueError(
            f'{owner}: high_depth must be None or dict(rule=...) with rule '
            f'one of {HIGH_DEPTH_RULES}, got {cfg!r}')
    rule = cfg['rule']
    unknown = set(cfg) - {'rule', 'low', 'high'}
    if unknown or (rule in ('minmax', 'raw') and set(cfg) != {'rule'}):
        takes = ('low and high' if rule in ('percentile', 'fixed') else
                 'no other keys')
        raise MMSafeValueError(
            f'{owner}: high_depth rule {rule!r} takes {takes}, got {cfg!r}')
    out = dict(rule=rule)
    if rule == 'percentile':
        low, high = (float(cfg.get('low', DEFAULT_PERCENTILES[0])),
                     float(cfg.get('high', DEFAULT_PERCENTILES[1])))
        if not 0 <= low < high <= 100:
            raise MMSafeValueError(
                f'{owner}: high_depth percentiles need 0 <= low < high <= '
                f'100, got low={low}, high={high}')
        out.update(low=low, high=high)
    elif rule == 'fixed':
        if 'low' not in cfg or 'high' not in cfg or \
                not float(cfg['low']) < float(cfg['high']):
            raise MMSafeValueError(
                f"{owner}: high_depth rule 'fixed' needs low < high (raw "
                'values mapped to 0 and 255, e.g. the range that '
                f'tools/check_dataset.py --stats reports), got {cfg!r}')
        out.update(low=float(cfg['low']), high=float(cfg['high']))
    return out


def read_high_depth(img_bytes: bytes, color_type: str) -> Optional[
        np.ndarray]:
    """Decode a file of more than 8 bits per channel with its full depth:
    its channels as stored, less an alpha channel for the colour types and
    made grey for the grey ones (a grey file stays ``H x W``: the caller
    repeats it into 3 channels after the rule maps it). None when it cannot
    be decoded."""
    img = cv2.imdecode(np.frombuffer(img_bytes, np.uint8),
                       cv2.IMREAD_UNCHANGED)
    if img is None or img.ndim == 2:
        return img
    if color_type.startswith('color') and img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2BGR)
    elif color_type.startswith('grayscale'):
        code = cv2.COLOR_BGRA2GRAY if img.shape[2] == 4 else \
            cv2.COLOR_BGR2GRAY
        img = cv2.cvtColor(img, code)
    return img


def normalise(img: np.ndarray, cfg: dict) -> Tuple[np.ndarray, dict]:
    """``img`` (raw values) mapped by the rule of ``cfg``, as float32.

    Returns:
        tuple: the image and the record: ``rule``, ``low`` and ``high``
        (the raw values mapped to 0 and 255; for ``'raw'`` the image's
        range, kept as it is).
    """
    rule = cfg['rule']
    data = img.astype(np.float32)
    if rule == 'raw':
        return data, dict(rule=rule, low=float(data.min()),
                          high=float(data.max()))
    if rule == 'minmax':
        low, high = float(data.min()), float(data.max())
    elif rule == 'percentile':
        low, high = (float(v) for v in np.percentile(
            data, (cfg['low'], cfg['high'])))
    else:
        low, high = cfg['low'], cfg['high']
    record = dict(rule=rule, low=low, high=high)
    if rule == 'percentile':
        record['percentiles'] = [cfg['low'], cfg['high']]
    if high <= low:  # a constant image: all 0 (FirstBatchStatsHook flags it)
        return np.zeros_like(data), record
    data -= low
    data *= 255.0 / (high - low)
    np.clip(data, 0.0, 255.0, out=data)
    return data, record


def refusal(owner: str, which: str, path: str, bits: int,
            img: np.ndarray) -> str:
    """Why a deeper image is refused, and the rules that keep it."""
    low, high = int(img.min()), int(img.max())
    levels = (high >> (bits - 8)) - (low >> (bits - 8)) + 1
    return (f'{owner}: the {which} image {path} has {bits} bits per '
            f'channel (values {low}-{high}); decoded to 8 bits it would keep '
            f'its high byte only ({levels} grey level'
            f'{"s" if levels > 1 else ""}). Keep its depth with high_depth '
            f"on {owner}: dict(rule='percentile', low=1, high=99) maps each "
            "image's 1st-99th percentile to 0-255; rule='minmax' its range; "
            "rule='fixed', low=..., high=... one dataset-wide range "
            '(tools/check_dataset.py CONFIG --stats reports it); '
            "rule='raw' keeps the counts (the preprocessor's mean/std then "
            'in counts).')


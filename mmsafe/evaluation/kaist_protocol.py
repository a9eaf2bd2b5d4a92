"""The KAIST benchmark's evaluation protocol, in one place.

These are the rules of the KAIST devkit (the MATLAB wrapper around Piotr
Dollar's ``bbGt`` that the KAIST papers report with, on the improved test
annotations), learnt from it and checked against it on published detection
files (docs/user_guides/datasets.md, "KAIST evaluation"):

- Objects are kept by label: ``person`` is the class; ``people``,
  ``person?`` and ``cyclist`` are ignore regions; any other label is
  dropped (neither ground truth nor an ignore region).
- A ``person`` becomes an ignore region when its bbGt ``ign`` flag is set,
  its height is outside the setting's range (both ends inclusive), its
  occlusion level (0 none, 1 partial, 2 heavy) is not one of the setting's,
  or its box leaves the border range: ``x`` and ``x + w`` must lie in
  [5, 635], ``y`` and ``y + h`` in [5, 507] (inclusive; 640x512 frames).
- Detections are not filtered: every score counts (negative ones too), no
  height filter, no aspect-ratio change; only the CVPR 2015 baseline
  setting squarifies the (non-ignored) ground truth to width = 0.41 height
  about its centre, as that paper's code did.
- Matching (IoU >= 0.5) and the miss-rate curve are
  :mod:`mmsafe.evaluation.miss_rate`'s.
- ``day`` frames are sets 00-02 and 06-08, ``night`` frames sets 03-05 and
  09-11 (the devkit's test-day / test-night: sets 06-08 / 09-11).
"""
import math
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np

from mmsafe.errors import MMSafeValueError

#: sets filmed by day; the others were filmed at night
DAY_SETS = frozenset({0, 1, 2, 6, 7, 8})
NIGHT_SETS = frozenset({3, 4, 5, 9, 10, 11})
#: the image conditions reported beside ``all`` frames
CONDITIONS = ('day', 'night')
_SET = re.compile(r'set(\d+)')


@dataclass(frozen=True)
class KAISTSetting:
    """Which ground truth one KAIST evaluation counts.

    Args:
        height (tuple): inclusive range of a counted person's box height in
            pixels (``math.inf`` for no upper bound).
        occlusions (tuple): the counted occlusion levels (0 none,
            1 partial, 2 heavy).
        labels (tuple): labels evaluated as the class.
        ignore_labels (tuple): labels that are ignore regions.
        x_range (tuple): inclusive range of a counted box's left and right
            edges (``x`` and ``x + w``).
        y_range (tuple): inclusive range of its top and bottom edges.
        squarify (float, optional): aspect ratio (width / height) that the
            counted boxes are given about their centres, keeping their
            height, before matching. None leaves the boxes as annotated.
    """

    height: Tuple[float, float]
    occlusions: Tuple[int, ...]
    labels: Tuple[str, ...] = ('person', )
    ignore_labels: Tuple[str, ...] = ('people', 'person?', 'cyclist')
    x_range: Tuple[float, float] = (5.0, 635.0)
    y_range: Tuple[float, float] = (5.0, 507.0)
    squarify: Optional[float] = None
    description: str = field(default='', compare=False)


INF = math.inf
#: the devkit's settings by name (``reasonable`` is the benchmark's)
SETTINGS: Dict[str, KAISTSetting] = {
    'reasonable': KAISTSetting(
        (55, INF), (0, 1),
        description='height >= 55 px, no or partial occlusion'),
    'all': KAISTSetting(
        (20, INF), (0, 1, 2),
        description='height >= 20 px, any occlusion'),
    'near': KAISTSetting((115, INF), (0, ),
                         description='height >= 115 px, no occlusion'),
    'medium': KAISTSetting((45, 115), (0, ),
                           description='height 45..115 px, no occlusion'),
    'far': KAISTSetting((1, 45), (0, ),
                        description='height 1..45 px, no occlusion'),
    'none': KAISTSetting((1, INF), (0, ),
                         description='no occlusion, any height'),
    'partial': KAISTSetting((1, INF), (1, ),
                            description='partial occlusion, any height'),
    'heavy': KAISTSetting((1, INF), (2, ),
                          description='heavy occlusion, any height'),
    'cvpr15-reasonable': KAISTSetting(
        (45, INF), (0, 1), y_range=(5.0, 475.0), squarify=0.41,
        description='the CVPR 2015 baseline code: height >= 45 px, no or '
        'partial occlusion, y in [5, 475], ground truth squarified to '
        'width 0.41 height'),
}


def get_setting(setting) -> KAISTSetting:
    """A :class:`KAISTSetting` from its name (or the setting itself)."""
    if isinstance(setting, KAISTSetting):
        return setting
    if setting not in SETTINGS:
        raise MMSafeValueError(
            f'unknown KAIST setting {setting!r}; the settings '
            f'are {sorted(SETTINGS)}')
    return SETTINGS[setting]


def condition_of(img_id: str) -> str:
    """``'day'`` or ``'night'`` from a frame id such as
    ``'set06/V000/I00019'``."""
    match = _SET.search(str(img_id))
    if match is None:
        raise MMSafeValueError(
            f'cannot tell day from night for {img_id!r}: '
            'KAIST frame ids name their set (setNN/VNNN/INNNNN)')
    number = int(match.group(1))
    if number in DAY_SETS:
        return 'day'
    if number in NIGHT_SETS:
        return 'night'
    raise MMSafeValueError(f'{img_id!r}: set{number:02d} is not a KAIST set '
                           '(set00-set11)')


def squarify(boxes: np.ndarray, aspect: float) -> np.ndarray:
    """``x, y, w, h`` boxes with width ``aspect * h`` about the same centre
    (the height kept)."""
    out = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    width = out[:, 3] * aspect
    out[:, 0] += (out[:, 2] - width) / 2
    out[:, 2] = width
    return out


def ground_truth(objects: Iterable[dict],
                 setting: KAISTSetting) -> Tuple[np.ndarray, np.ndarray]:
    """The boxes a setting evaluates in one frame.

    Args:
        objects: raw annotated objects, each with ``label_name``, ``bbox``
            (``x1, y1, x2, y2`` with ``x2 = x + w``), ``occlusion`` and
            ``ign`` (the bbGt ignore flag).
        setting: the evaluation setting.

    Returns:
        tuple: ``x, y, w, h`` boxes (float64, shape ``(n, 4)``) and their
        ignore flags (bool, shape ``(n, )``), in the annotation's order.
    """
    boxes, ignore = [], []
    keep = set(setting.labels) | set(setting.ignore_labels)
    (hmin, hmax), (xmin, xmax), (ymin, ymax) = (setting.height,
                                                setting.x_range,
                                                setting.y_range)
    for obj in objects:
        label = obj['label_name']
        if label not in keep:
            continue
        x1, y1, x2, y2 = (float(v) for v in obj['bbox'])
        w, h = x2 - x1, y2 - y1
        ign = (bool(obj.get('ign', 0)) or label in setting.ignore_labels
               or not (xmin <= x1 <= xmax and xmin <= x2 <= xmax)
               or not (ymin <= y1 <= ymax and ymin <= y2 <= ymax)
               or not hmin <= h <= hmax
               or int(obj.get('occlusion', 0)) not in setting.occlusions)
        boxes.append((x1, y1, w, h))
        ignore.append(ign)
    boxes = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    ignore = np.array(ignore, dtype=bool)
    if setting.squarify is not None and (~ignore).any():
        boxes[~ignore] = squarify(boxes[~ignore], setting.squarify)
    return boxes, ignore


def setting_names(settings: Sequence) -> Tuple[str, ...]:
    """Validated setting names (each must be in :data:`SETTINGS`)."""
    names = tuple(settings)
    for name in names:
        get_setting(name)
    if len(set(names)) != len(names):
        raise MMSafeValueError(f'KAIST settings repeat a name: {names}')
    return names

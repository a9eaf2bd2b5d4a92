"""Does the infrared image show something where a box is?

People are warm, and a thermal camera shows them at night whatever the
light: a person's box in the infrared image holds a body that stands out
from the ground around it. Paired with the wrong moment of a fixed-camera
scene, the same box stands on empty ground. This module measures, on the
infrared image alone, the box's content against a ring around it:

* ``contrast``: how much warmer the core of the box (its central
  ``core`` share of width x height, where a body is) is than the ring
  (``ring`` times each side around the box, the box excluded), in units
  of the ring's standard deviation (plus ``noise`` grey levels, so that a
  flat ring does not make a few grey levels count);
* ``texture``: the mean gradient magnitude of the core over the ring's
  (plus ``noise``), the outline and folds of a body whatever its
  polarity (on a ground warmed by the day a person can be no warmer
  than the ground, but still shows as a shape).

Their state (``PRESENCE_STATES``):

* ``'warm'``: ``contrast >= warm``;
* ``'outline'``: not warm, ``texture >= outline``;
* ``'empty'``: ``contrast < empty_contrast`` and ``texture <
  empty_texture``: the box looks like its surroundings;
* ``'unclear'``: between the two;
* ``'small'`` (a side under ``min_box`` pixels), ``'border'`` (less than
  ``min_ring`` of the ring inside the image) and ``'flat'`` (the box and
  ring are one grey level: a blank or padded region) say why there is no state.

The thresholds were set on real LLVIP night pairs (1280x1024, people
100-320 px tall): the boxes of registered pairs are warm or outlined
(97%; 1 of 222 empty), the same boxes on the infrared image of the next
file of the scene (people gone, empty pavement) are empty for 84% of them
(a passer-by can stand in any box). Everything is computed at a working
scale where the box's longer side has at most ``work_size`` pixels, so
the cost per box does not grow with the image.
"""
from typing import Dict, Sequence, Tuple

import numpy as np

from .box_matching import shrink
from .pair_alignment import gradient_magnitude

WARM, OUTLINE, EMPTY, UNCLEAR = 'warm', 'outline', 'empty', 'unclear'
SMALL, BORDER, FLAT = 'small', 'border', 'flat'
PRESENT = (WARM, OUTLINE)
PRESENCE_STATES = (WARM, OUTLINE, EMPTY, UNCLEAR, SMALL, BORDER, FLAT)


def grey_view(img: np.ndarray) -> np.ndarray:
    """An ``H x W (x C)`` array as float32 grey (channel mean; 1 channel
    as it is)."""
    if img.ndim == 3:
        if img.shape[2] == 1:
            img = img[..., 0]
        else:
            return img.mean(axis=2, dtype=np.float32)
    return img.astype(np.float32, copy=False)


def _window(box: Sequence[float], ring: float, width: int,
            height: int) -> Tuple[int, int, int, int]:
    x1, y1, x2, y2 = box
    mx, my = ring * (x2 - x1), ring * (y2 - y1)
    return (int(max(0, np.floor(x1 - mx))), int(max(0, np.floor(y1 - my))),
            int(min(width, np.ceil(x2 + mx))),
            int(min(height, np.ceil(y2 + my))))


def infrared_presence(infrared: np.ndarray,
                      box: Sequence[float],
                      core: Tuple[float, float] = (0.6, 0.8),
                      ring: float = 0.35,
                      work_size: int = 64,
                      min_box: float = 8.0,
                      min_ring: float = 0.3,
                      min_std: float = 0.1,
                      noise: float = 4.0,
                      warm: float = 1.0,
                      outline: float = 2.0,
                      empty_contrast: float = 0.6,
                      empty_texture: float = 1.5) -> Dict:
    """What the infrared image shows in ``box``.

    Args:
        infrared: ``H x W (x C)`` array (an ``hwc_view``), grey levels
            0-255.
        box: ``(x1, y1, x2, y2)`` in its pixels.
        core (tuple): the share of the box's width and height, centred,
            that a body fills.
        ring (float): width of the ring around the box, as a share of
            each side.
        work_size (int): the box's longer side is measured at most this
            many pixels long (area downscaling).
        min_box (float): a shorter side below this gets ``'small'``.
        min_ring (float): the share of the ring that must lie inside the
            image (else ``'border'``).
        min_std (float): the standard deviation (grey levels) below which
            the box and ring hold no image to measure (``'flat'``: a
            blank or padded region).
        noise (float): added to the ring's standard deviation and to its
            mean gradient (grey levels): the floor of the units.
        warm, outline, empty_contrast, empty_texture (float): the
            thresholds of the states (see the module's docstring).

    Returns:
        dict: ``state`` (one of :data:`PRESENCE_STATES`), ``contrast`` and
        ``texture`` (None without a measurement).
    """
    height, width = infrared.shape[:2]
    x1, y1, x2, y2 = (float(v) for v in box)
    bw, bh = x2 - x1, y2 - y1
    out = dict(state=SMALL, contrast=None, texture=None)
    if min(bw, bh) < min_box:
        return out
    wx1, wy1, wx2, wy2 = _window((x1, y1, x2, y2), ring, width, height)
    full = (1 + 2 * ring)**2 * bw * bh - bw * bh
    inside = (wx2 - wx1) * (wy2 - wy1) - max(
        0.0, min(x2, wx2) - max(x1, wx1)) * max(0.0,
                                                min(y2, wy2) - max(y1, wy1))
    if wx2 <= wx1 or wy2 <= wy1 or inside < min_ring * full:
        out['state'] = BORDER
        return out
    crop = infrared[wy1:wy2, wx1:wx2]
    scale = min(1.0, work_size / max(bw, bh))
    if scale < 1.0:
        # shrink first (in the input's channels): the rest works on a few
        # thousand pixels whatever the box
        crop = shrink(crop, scale, min_size=3)
    crop = grey_view(crop)
    if float(crop.std()) < min_std:
        out['state'] = FLAT
        return out
    # pixel centres of the working crop in image coordinates
    sx = crop.shape[1] / float(wx2 - wx1)
    sy = crop.shape[0] / float(wy2 - wy1)
    xs = wx1 + (np.arange(crop.shape[1]) + 0.5) / sx
    ys = wy1 + (np.arange(crop.shape[0]) + 0.5) / sy
    in_x, in_y = (xs >= x1) & (xs < x2), (ys >= y1) & (ys < y2)
    cx, cy = (x1 + x2) / 2.0, (y1 + y2) / 2.0
    core_x = np.abs(xs - cx) <= core[0] * bw / 2.0
    core_y = np.abs(ys - cy) <= core[1] * bh / 2.0
    core_m = core_y[:, None] & core_x[None, :]
    ring_m = ~(in_y[:, None] & in_x[None, :])
    if not core_m.any() or not ring_m.any():
        out['state'] = BORDER
        return out
    grad = gradient_magnitude(crop)
    ring_px = crop[ring_m]
    contrast = (float(crop[core_m].mean()) - float(ring_px.mean())) / (
        float(ring_px.std()) + noise)
    texture = float(grad[core_m].mean()) / (float(grad[ring_m].mean()) +
                                            noise)
    out.update(contrast=round(contrast, 3), texture=round(texture, 3))
    if contrast >= warm:
        out['state'] = WARM
    elif texture >= outline:
        out['state'] = OUTLINE
    elif contrast < empty_contrast and texture < empty_texture:
        out['state'] = EMPTY
    else:
        out['state'] = UNCLEAR
    return out

"""Where is a box's content in the other modality? Gradient matching of
one box.

The gradient-magnitude map of one image inside the box (plus a small
margin) is correlated (``cv2.matchTemplate``, ``TM_CCOEFF_NORMED``) with
the other image's map over a search window around it (``search`` times
the box's longer side), at a working scale where the box's longer side
has ``work_size`` map pixels; the peak is refined to a fraction of a map
pixel (a parabola through its neighbours). The content found there is
looked for back in the first image's window and must lead back to the
box (``consistency``): a chance match of background edges (a kerb line
through a faint person) does not.

The template is the visible box by default; ``templates`` can add the
infrared box looked for in the visible image (its crop carries the
person's outline at night). On real LLVIP night pairs the second way
found the same boxes as the first (the dark visible window is what fails
the match, whichever side the template comes from) at twice the cost, so
it is off by default. The offset ``(dx, dy)`` is always where the box's
content sits in the infrared image minus where it sits in the visible
one, in pixels of the images given.
"""
from typing import Dict, Optional, Sequence, Tuple

import cv2
import numpy as np

from .pair_alignment import correlation, gradient_magnitude

VISIBLE, INFRARED = 'visible', 'infrared'


def _grey(crop: np.ndarray) -> np.ndarray:
    """A crop (an ``hwc_view``) as contiguous float32 grey."""
    crop = crop.astype(np.float32)
    if crop.ndim == 3:
        crop = crop[..., 0] if crop.shape[2] == 1 else crop.mean(axis=2)
    return np.ascontiguousarray(crop)


def shrink(img: np.ndarray, scale: float, min_size: int = 4) -> np.ndarray:
    """``img`` downscaled by ``scale`` (< 1): area averaging by the whole
    factor (OpenCV's fast path for integer factors; the last pixels of the
    right and bottom edges that do not fill a whole cell are dropped), then
    linear interpolation for the rest (less than a factor 2). uint8 and
    float32 stay as they are; other dtypes become float32."""
    if img.dtype not in (np.uint8, np.float32):
        img = img.astype(np.float32)
    h, w = img.shape[:2]
    size = (max(min_size, int(round(w * scale))),
            max(min_size, int(round(h * scale))))
    k = int(min(w / size[0], h / size[1]))
    if k >= 2:
        img = img[:h // k * k, :w // k * k]
        img = cv2.resize(np.ascontiguousarray(img), (w // k, h // k),
                         interpolation=cv2.INTER_AREA)
    if (img.shape[1], img.shape[0]) != size:
        img = cv2.resize(np.ascontiguousarray(img), size,
                         interpolation=cv2.INTER_LINEAR)
    return img


def _gradient(crop: np.ndarray, scale: float) -> np.ndarray:
    """Gradient magnitude of an image crop at ``scale`` (downscaled, then
    grey)."""
    if scale < 1.0:
        crop = shrink(crop, scale)
    return gradient_magnitude(_grey(crop))


def _subpixel(result: np.ndarray, iy: int, ix: int) -> Tuple[float, float]:
    """Parabola through the peak and its neighbours, per axis."""
    def vertex(a: float, b: float, c: float) -> float:
        den = a - 2 * b + c
        return 0.0 if den >= 0 else float(np.clip(0.5 * (a - c) / den,
                                                  -0.5, 0.5))
    fy = vertex(result[iy - 1, ix], result[iy, ix], result[iy + 1, ix])
    fx = vertex(result[iy, ix - 1], result[iy, ix], result[iy, ix + 1])
    return fx, fy


def _match(window: np.ndarray, source: np.ndarray, ox: int, oy: int,
           tw: int, th: int) -> Tuple[float, float, Optional[float],
                                      Optional[float]]:
    """Find ``source``'s box (at ``ox, oy``, ``tw x th``) in ``window``:
    best correlation, correlation unshifted, and the shift in map pixels
    (None when the best match is on the edge of the search window)."""
    result = correlation(window, source[oy:oy + th, ox:ox + tw])
    iy, ix = np.unravel_index(int(np.argmax(result)), result.shape)
    best, zero = float(result[iy, ix]), float(result[oy, ox])
    if iy in (0, result.shape[0] - 1) or ix in (0, result.shape[1] - 1):
        return best, zero, None, None
    fx, fy = _subpixel(result, iy, ix)
    return best, zero, ix + fx - ox, iy + fy - oy


def _one_way(source: np.ndarray, target: np.ndarray, ox: int, oy: int,
             tw: int, th: int, min_structure: float, min_corr: float,
             consistency: float) -> Dict:
    """``source``'s box found in ``target`` and back; the shift in map
    pixels of where the content sits in ``target`` minus in ``source``."""
    out = dict(corr=None, corr_zero=None, shift=None)
    if float(source[oy:oy + th, ox:ox + tw].mean()) < min_structure:
        out['reason'] = 'no_structure'
        return out
    fwd = _match(target, source, ox, oy, tw, th)
    out.update(corr=round(fwd[0], 4), corr_zero=round(fwd[1], 4))
    if fwd[0] < min_corr:
        out['reason'] = 'weak'
        return out
    if fwd[2] is None:
        # the best match is on the edge of the search window: the true one
        # may lie beyond it
        out['reason'] = 'edge'
        return out
    bx, by = ox + int(round(fwd[2])), oy + int(round(fwd[3]))
    bwd = _match(source, target, bx, by, tw, th)
    if bwd[2] is None or np.hypot(fwd[2] + bwd[2],
                                  fwd[3] + bwd[3]) > consistency:
        out['reason'] = 'inconsistent'
        return out
    out['shift'] = (fwd[2], fwd[3])
    return out


def box_match(visible: np.ndarray,
              infrared: np.ndarray,
              box: Sequence[float],
              templates: Sequence[str] = (VISIBLE, ),
              search: float = 0.75,
              min_search: float = 16.0,
              margin: float = 0.1,
              work_size: int = 80,
              min_box: float = 8.0,
              min_structure: float = 2.0,
              min_corr: float = 0.5,
              consistency: float = 1.5) -> Dict:
    """Offset of one box's content between two images (same size).

    Args:
        visible, infrared: ``H x W (x C)`` arrays (``hwc_view``), same
            size.
        box: ``(x1, y1, x2, y2)`` in their pixels.
        templates (Sequence[str]): which image's box is looked for in the
            other (``'visible'``, ``'infrared'``, or both in turn; the
            estimate of the best match is kept).
        search (float): search radius as a share of the box's longer side
            (at least ``min_search`` pixels).
        margin (float): margin around the box in the template, as a share
            of each side.
        work_size (int): map pixels of the box's longer side.
        min_box (float): boxes with a shorter side below this get no
            estimate.
        min_structure (float): mean gradient magnitude (grey levels per
            pixel) below which a template has no structure.
        min_corr (float): a weaker best match gives no estimate (0.5: on
            real night pairs, dark visible crops give chance matches near
            0.3-0.45 far from the person).
        consistency (float): map pixels by which the way back may miss
            the box.

    Returns:
        dict: ``dx``, ``dy`` (pixels of these images; None without an
        estimate), ``corr`` and ``corr_zero`` (best and unshifted match of
        the template that gave the estimate, else of the first one
        tried), ``template`` (which one gave it), ``confident`` and,
        without an estimate, ``reason`` (the first template's).
    """
    h, w = visible.shape[:2]
    x1, y1, x2, y2 = (float(v) for v in box)
    bw, bh = x2 - x1, y2 - y1
    out = dict(dx=None, dy=None, corr=None, corr_zero=None, template=None,
               confident=False)
    if min(bw, bh) < min_box:
        out['reason'] = 'small'
        return out
    scale = min(1.0, work_size / max(bw, bh))
    radius = max(min_search, search * max(bw, bh))
    mx, my = margin * bw, margin * bh
    # template: the box plus margin, clipped to the image
    tx1, ty1 = int(max(0, np.floor(x1 - mx))), int(max(0, np.floor(y1 - my)))
    tx2, ty2 = int(min(w, np.ceil(x2 + mx))), int(min(h, np.ceil(y2 + my)))
    # window: the template plus the search radius, clipped
    wx1, wy1 = int(max(0, tx1 - radius)), int(max(0, ty1 - radius))
    wx2, wy2 = int(min(w, tx2 + radius)), int(min(h, ty2 + radius))
    maps = {INFRARED: _gradient(infrared[wy1:wy2, wx1:wx2], scale),
            VISIBLE: _gradient(visible[wy1:wy2, wx1:wx2], scale)}
    # the template cut from its window's map (same scale and grid)
    sx = maps[INFRARED].shape[1] / float(wx2 - wx1)
    sy = maps[INFRARED].shape[0] / float(wy2 - wy1)
    ox, oy = int(round((tx1 - wx1) * sx)), int(round((ty1 - wy1) * sy))
    tw = max(4, int(round((tx2 - tx1) * sx)))
    th = max(4, int(round((ty2 - ty1) * sy)))
    shape = maps[VISIBLE].shape
    if oy + th > shape[0] or ox + tw > shape[1] or shape[0] < th + 2 or \
            shape[1] < tw + 2:
        out['reason'] = 'border'
        return out
    found = []
    for name in templates:
        other = INFRARED if name == VISIBLE else VISIBLE
        one = _one_way(maps[name], maps[other], ox, oy, tw, th,
                       min_structure, min_corr, consistency)
        one['template'] = name
        if one['shift'] is not None and name == INFRARED:
            # found the infrared content in the visible image: the
            # infrared-minus-visible offset is the opposite shift
            one['shift'] = (-one['shift'][0], -one['shift'][1])
        found.append(one)
    hits = [f for f in found if f['shift'] is not None]
    best = max(hits, key=lambda f: f['corr']) if hits else found[0]
    out.update(corr=best['corr'], corr_zero=best['corr_zero'])
    if best['shift'] is None:
        out['reason'] = best['reason']
        return out
    out.update(dx=float(best['shift'][0] / sx),
               dy=float(best['shift'][1] / sy), template=best['template'],
               confident=True)
    return out

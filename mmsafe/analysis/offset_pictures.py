"""Pictures of the per-box measure (:mod:`.object_offsets`): each box's
verdict written on the drawn pair, and the histogram of ``|d|``."""
from typing import Dict, Optional, Sequence, Tuple

import cv2
import numpy as np

from mmsafe.errors import MMSafeOSError
from .pair_vis import put_label

AGREES = (255, 255, 0)  # BGR: cyan, the box agrees with its content
DISAGREES = (0, 0, 255)  # red: a finding
NO_VERDICT = (200, 200, 200)


def histogram_image(ds: Sequence[float], max_offset: float = 8.0,
                    bins: int = 24, size: Tuple[int, int] = (640, 360)
                    ) -> np.ndarray:
    """A bar chart of ``|d|`` (cv2 drawing), with the flag threshold."""
    width, height = size
    img = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 50, 15, 30, 40
    arr = np.asarray(ds, dtype=np.float64)
    hi = max(2.0 * max_offset, float(arr.max()) if arr.size else 1.0)
    hi = float(np.ceil(hi))
    counts, edges = np.histogram(arr, bins=bins, range=(0.0, hi))
    peak = max(1, int(counts.max()) if counts.size else 1)
    pw, ph = width - left - right, height - top - bottom
    black = (0, 0, 0)
    cv2.line(img, (left, top + ph), (left + pw, top + ph), black, 1)
    cv2.line(img, (left, top), (left, top + ph), black, 1)
    for i, c in enumerate(counts):
        x1 = left + int(i * pw / bins)
        x2 = left + int((i + 1) * pw / bins) - 1
        y1 = top + ph - int(round(c * ph / peak))
        cv2.rectangle(img, (x1, y1), (x2, top + ph), (180, 120, 40), -1)
    xt = left + int(max_offset / hi * pw)
    cv2.line(img, (xt, top), (xt, top + ph), (0, 0, 255), 1)
    font = cv2.FONT_HERSHEY_SIMPLEX
    cv2.putText(img, f'max_offset {max_offset:g}', (xt + 3, top + 12), font,
                0.4, (0, 0, 255), 1)
    for k in range(5):
        v = hi * k / 4
        x = left + int(v / hi * pw)
        cv2.putText(img, f'{v:.0f}', (x - 6, top + ph + 15), font, 0.4,
                    black, 1)
    cv2.putText(img, str(peak), (5, top + 10), font, 0.4, black, 1)
    cv2.putText(img, '0', (30, top + ph), font, 0.4, black, 1)
    cv2.putText(img, '|d| (px, original resolution)',
                (left + pw // 2 - 100, height - 8), font, 0.45, black, 1)
    med = float(np.median(arr)) if arr.size else float('nan')
    cv2.putText(img, f'per-box visible/infrared offsets: {arr.size} matched '
                f'boxes, median {med:.1f} px', (left, 18), font, 0.45, black,
                1)
    return img


def write_histogram(path: str, ds: Sequence[float],
                    max_offset: float = 8.0) -> str:
    """Write :func:`histogram_image` as a PNG at ``path``."""
    if not cv2.imwrite(path, histogram_image(ds, max_offset)):
        raise MMSafeOSError(f'could not write {path}')
    return path


def draw_offsets(canvas: np.ndarray, result: Optional[Dict],
                 width: int, gap: int, scale_factor=None,
                 flip_direction: Optional[str] = None) -> np.ndarray:
    """Write each box's verdict on the infrared half of a ``visible |
    infrared`` canvas (:func:`mmsafe.analysis.pair_vis.draw_pair`): its
    short label (``match 3px``, ``warm 2.4``, ``outline 3.1``, ``empty
    0.2``, ``? small``, ...) under the box, red where the box disagrees
    with what the infrared image shows, cyan where it agrees, grey without
    a verdict; a matched box also gets an arrow from its centre to where
    its content is.

    Args:
        canvas: the drawn pair (changed in place and returned).
        result: a :func:`mmsafe.analysis.object_offsets.pair_offsets`
            result of the same boxes.
        width (int): width of the visible half; ``gap``: pixels between.
        scale_factor, flip_direction: the sample's, to turn the offsets
            back into the drawn (pipeline) pixels.
    """
    if not result:
        return canvas
    sf = np.ones(2)
    if scale_factor is not None:
        arr = np.asarray(scale_factor, dtype=np.float64).reshape(-1)
        sf = arr[:2] if arr.size >= 2 else np.repeat(arr[:1], 2)
    base = width + gap
    for r in result['boxes']:
        x1, y1, x2, y2 = r['box']
        color = NO_VERDICT
        if r.get('disagrees') is not None:
            color = DISAGREES if r['disagrees'] else AGREES
        if r['dx'] is not None:
            cx, cy = base + (x1 + x2) / 2.0, (y1 + y2) / 2.0
            dx, dy = r['dx'] * sf[0], r['dy'] * sf[1]
            if flip_direction in ('horizontal', 'diagonal'):
                dx = -dx
            if flip_direction in ('vertical', 'diagonal'):
                dy = -dy
            p = (int(round(cx)), int(round(cy)))
            q = (int(round(cx + dx)), int(round(cy + dy)))
            cv2.arrowedLine(canvas, p, q, color, 1, tipLength=0.3)
            cv2.circle(canvas, p, 1, color, -1)
        put_label(canvas, r['label'],
                  (int(round(base + x1)), int(round(y2)) + 10), color)
    return canvas

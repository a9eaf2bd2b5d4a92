"""16-bit radiometric thermal frames as cameras store them: single-channel
PNG or TIFF of raw counts (here 51,300-52,150, a night scene with one warm
person), beside 8-bit visible images in the LLVIP layout."""
import glob
import os.path as osp
from typing import Dict, Tuple

import cv2
import numpy as np

from tests.datasets.tree import make_llvip_tree

#: the counts of the frames: background ramp from LOW, the person at HIGH
LOW, HIGH = 51300, 52150
#: a pixel of each value, and one of the middle count (51,725)
LOW_AT, HIGH_AT, MID_AT = (0, 0), (20, 10), (47, 63)
MID = (LOW + HIGH) // 2
SIZE = (64, 48)
BOX = (5, 6, 20, 30)


def thermal_counts(size: Tuple[int, int] = SIZE, seed: int = 0) -> \
        np.ndarray:
    """``(h, w)`` uint16 counts: a ramp of the background (51,300 to
    51,800), a warm person (52,000-52,150) in :data:`BOX`, sensor noise."""
    w, h = size
    rng = np.random.default_rng(seed)
    img = np.linspace(LOW, LOW + 500, w)[None, :].repeat(h, 0)
    img = img + rng.normal(0, 8, (h, w))
    x1, y1, x2, y2 = BOX
    img[y1:y2, x1:x2] = rng.uniform(52000, HIGH, (y2 - y1, x2 - x1))
    img = np.clip(np.round(img), LOW, HIGH).astype(np.uint16)
    img[LOW_AT], img[HIGH_AT], img[MID_AT] = LOW, HIGH, MID
    return img


def write_thermal_tree(root: str, ext: str = '.png',
                       num: int = 2) -> Dict[str, np.ndarray]:
    """An LLVIP tree of ``num`` pairs whose infrared files are 16-bit
    ``ext`` (``'.png'`` or ``'.tif'``); returns path -> counts."""
    specs = {f'{i + 10001:06d}': dict(size=SIZE, objects=[('person', BOX,
                                                          0)])
             for i in range(num)}
    make_llvip_tree(root, specs=specs, ext=ext)
    written = {}
    for i, path in enumerate(sorted(glob.glob(
            osp.join(root, 'infrared', 'train', '*' + ext)))):
        counts = thermal_counts(seed=i)
        assert cv2.imwrite(path, counts), path
        written[path] = counts
    return written

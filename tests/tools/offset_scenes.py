"""Synthetic visible + infrared scenes whose people are placed by hand:
the same background (a fixed camera) with people drawn at chosen places in
each modality, for the per-box offset tests.

Two kinds of light: by day (:func:`scene_pairs`) the visible people stand
out from the ground (35-55 grey levels), so their outline can be matched;
at night (:func:`night_pairs`) the visible image is dark and noisy and its
people are a few grey levels off the ground (little to match), while the
infrared people are as warm as ever: the physics of real night pairs."""
import os
import os.path as osp
from typing import List, Optional, Sequence, Tuple

import cv2
import numpy as np

from mmsafe.datasets.synthetic_llvip import (_person_mask, _voc_xml,
                                             render_pair, synthetic_params)

Person = Tuple[float, float, float, float]  # x1, y1, width, height


def background(size: Tuple[int, int], seed: int
               ) -> Tuple[np.ndarray, np.ndarray]:
    """A scene without people (float32 visible BGR, infrared grey): the
    synthetic generator's night background plus the fixed structures of a
    street (building fronts, windows, kerbs) that show in both
    modalities with other intensities."""
    params = synthetic_params(img_size=size, empty_ratio=1.0, seed=seed)
    vis, ir, boxes = render_pair(params, 'train', 0)
    assert boxes == []
    vis, ir = vis.astype(np.float32), ir[..., 0].astype(np.float32)
    rng = np.random.default_rng([seed, 17])
    width, height = size
    for _ in range(12):
        w, h = rng.uniform(0.05, 0.3) * width, rng.uniform(0.05, 0.3) * height
        x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
        m = np.zeros((height, width), np.float32)
        cv2.rectangle(m, (int(x), int(y)), (int(x + w), int(y + h)), 1.0,
                      int(rng.choice([-1, 2, 3])))
        vis += m[..., None] * rng.uniform(25, 60)
        ir += m * rng.uniform(15, 35)
    for _ in range(3):
        y = rng.uniform(0.4, 1.0) * height
        m = np.zeros((height, width), np.float32)
        cv2.line(m, (0, int(y)), (width - 1, int(y + rng.uniform(-20, 20))),
                 1.0, 2)
        vis += m[..., None] * rng.uniform(30, 60)
        ir += m * rng.uniform(15, 30)
    return vis, ir


def _alpha(width: int, height: int, person: Person) -> np.ndarray:
    mask = _person_mask(width, height, person)
    return cv2.GaussianBlur(mask.astype(np.float32) / 255.0, (3, 3), 0)


def draw_people(bg: Tuple[np.ndarray, np.ndarray], people: Sequence[Person],
                shifts: Optional[Sequence[Tuple[float, float]]] = None,
                seed: int = 0, cloth: Tuple[float, float] = (35, 55),
                temps: Optional[Sequence[Optional[float]]] = None,
                ir_people: Optional[Sequence[Person]] = None,
                vis_noise: float = 5.0
                ) -> Tuple[np.ndarray, np.ndarray, List]:
    """Draw ``people`` on a copy of ``bg``: in visible where given, in
    infrared moved by ``shifts`` (``(dx, dy)`` per person; none: in
    place), or, with ``ir_people``, those people in infrared instead (the
    scene at another moment). Returns uint8 visible, uint8 infrared (grey
    in 3 channels) and the visible boxes ``[x1, y1, x2, y2]``.

    Args:
        cloth: how far (grey levels, either way) the visible people are
            off the ground.
        temps: each infrared person's grey level (random 175-235 by
            default); None for a person as cold as the ground (not drawn
            in infrared).
        vis_noise: the visible image's pixel noise (standard deviation).
    """
    rng = np.random.default_rng(seed)
    vis, ir = bg[0].copy(), bg[1].copy()
    height, width = ir.shape
    boxes = []
    shifts = shifts or [(0.0, 0.0)] * len(people)
    temps = list(temps) if temps is not None else [
        'random'] * len(ir_people if ir_people is not None else people)

    def warm(alpha_ir: np.ndarray, temp) -> None:
        nonlocal ir
        if temp == 'random':
            temp = rng.uniform(175, 235)
        if temp is not None:  # None: as warm as the ground, not seen
            ir = ir * (1 - alpha_ir) + alpha_ir * temp

    for i, (person, (sx, sy)) in enumerate(zip(people, shifts)):
        alpha = _alpha(width, height, person)
        ys, xs = np.nonzero(_person_mask(width, height, person))
        boxes.append([int(xs.min()), int(ys.min()), int(xs.max()),
                      int(ys.max())])
        offset = rng.uniform(*cloth) * rng.choice([-1.0, 1.0])
        vis = vis + alpha[..., None] * (
            offset + rng.uniform(-6, 6, size=3).astype(np.float32))
        if ir_people is None:
            # the infrared person: the same outline at the shifted place
            # (sub-pixel shifts through an affine warp of the mask)
            m = np.float32([[1, 0, sx], [0, 1, sy]])
            warm(cv2.warpAffine(alpha, m, (width, height),
                                flags=cv2.INTER_LINEAR), temps[i])
    for person, temp in zip(ir_people or (), temps):
        warm(_alpha(width, height, person), temp)
    vis = vis + rng.normal(0, vis_noise, size=vis.shape)
    ir = ir + rng.normal(0, 3, size=ir.shape)
    vis_u8 = np.clip(np.round(vis), 0, 255).astype(np.uint8)
    ir_u8 = np.clip(np.round(ir), 0, 255).astype(np.uint8)
    return vis_u8, np.repeat(ir_u8[..., None], 3, axis=2), boxes


def random_people(rng: np.random.Generator, size: Tuple[int, int], n: int,
                  height: Tuple[float, float]) -> List[Person]:
    """``n`` people of ``height`` (min, max) that do not overlap much and
    leave room for a 40 px move."""
    width, img_h = size
    people: List[Person] = []
    for _ in range(50 * n):
        if len(people) == n:
            break
        h = rng.uniform(*height)
        w = h * rng.uniform(0.34, 0.5)
        x1 = rng.uniform(45, width - w - 45)
        y1 = rng.uniform(5, img_h - h - 5)
        if all(abs(x1 - p[0]) > (w + p[2]) / 2 + 45 for p in people):
            people.append((x1, y1, w, h))
    return people


def scene_pairs(size: Tuple[int, int], num: int, other_moment: bool = False,
                seed: int = 0, height=(30, 60)):
    """``num`` pairs of one fixed-camera scene (the same background in
    every pair, 1-3 people elsewhere in each). With ``other_moment`` each
    infrared image is the same scene at another moment: the same
    background, every person moved by 15-35 px sideways and up to 3 px
    up or down. Yields ``(visible, infrared, boxes, shifts)``."""
    bg = background(size, seed)
    rng = np.random.default_rng(seed + 1)
    for i in range(num):
        people = random_people(rng, size, int(rng.integers(1, 4)), height)
        shifts = [(0.0, 0.0)] * len(people)
        if other_moment:
            shifts = [(float(rng.choice([-1, 1]) * rng.uniform(15, 35)),
                       float(rng.uniform(-3, 3))) for _ in people]
        vis, ir, boxes = draw_people(bg, people, shifts, seed=100 + i)
        yield vis, ir, boxes, shifts


def night(bg: Tuple[np.ndarray, np.ndarray]
          ) -> Tuple[np.ndarray, np.ndarray]:
    """The same scene at night: the visible image dark (a quarter of its
    grey levels, the street structures faint), the infrared one as it is
    (the ground keeps its temperature)."""
    return bg[0] * 0.25 + 6.0, bg[1]


def night_pairs(size: Tuple[int, int], num: int, late: bool = False,
                seed: int = 0, height=(50, 100),
                cold: Sequence[Tuple[int, int]] = ()):
    """``num`` night pairs of one fixed-camera scene, 1-3 people each (the
    scene's frames ``0..num``, each with its own people). The visible people
    are 3-7 grey levels off a dark, noisy ground (little structure to
    match); in infrared they are warm. With ``late`` each infrared image is
    the next frame's (the folder one file late: the same background, the
    people of the next moment elsewhere, the boxes on empty ground).
    ``cold`` lists ``(pair, person)`` people as warm as the ground. Yields
    ``(visible, infrared, boxes, infrared_boxes)``."""
    bg = night(background(size, seed))
    rng = np.random.default_rng(seed + 3)
    frames = [random_people(rng, size, int(rng.integers(1, 4)), height)
              for _ in range(num + 1)]
    for i in range(num):
        shown = frames[i + 1] if late else frames[i]
        temps = [None if (i, k) in cold else float(rng.uniform(175, 235))
                 for k in range(len(shown))]
        vis, ir, boxes = draw_people(bg, frames[i], seed=200 + i,
                                     cloth=(3, 7), temps=temps,
                                     ir_people=shown, vis_noise=4.0)
        ir_boxes = [[x1, y1, x1 + w, y1 + h] for x1, y1, w, h in shown]
        yield vis, ir, boxes, ir_boxes


def write_llvip_scene_tree(root: str, size: Tuple[int, int], num: int,
                           other_moment: bool = False, seed: int = 0,
                           height=(30, 60), split: str = 'train') -> str:
    """:func:`scene_pairs` written as an LLVIP-layout tree at ``root``."""
    for sub in ('Annotations', f'visible/{split}', f'infrared/{split}'):
        os.makedirs(osp.join(root, sub), exist_ok=True)
    pairs = scene_pairs(size, num, other_moment, seed, height)
    for i, (vis, ir, boxes, _) in enumerate(pairs):
        stem = f'{i + 1:06d}'
        cv2.imwrite(osp.join(root, f'visible/{split}/{stem}.jpg'), vis,
                    [cv2.IMWRITE_JPEG_QUALITY, 92])
        cv2.imwrite(osp.join(root, f'infrared/{split}/{stem}.jpg'), ir,
                    [cv2.IMWRITE_JPEG_QUALITY, 92])
        with open(osp.join(root, 'Annotations', f'{stem}.xml'), 'w',
                  encoding='utf-8') as f:
            f.write(_voc_xml(f'{stem}.jpg', size[0], size[1], boxes))
    return root


def write_llvip_night_tree(root: str, size: Tuple[int, int], num: int,
                           seed: int = 0, split: str = 'train') -> str:
    """:func:`night_pairs` (paired right) written as an LLVIP-layout tree
    at ``root``: consecutive file numbers of one fixed-camera scene, each
    file's people their own moment's."""
    for sub in ('Annotations', f'visible/{split}', f'infrared/{split}'):
        os.makedirs(osp.join(root, sub), exist_ok=True)
    pairs = night_pairs(size, num, seed=seed)
    for i, (vis, ir, boxes, _) in enumerate(pairs):
        stem = f'{10001 + i:06d}'
        cv2.imwrite(osp.join(root, f'visible/{split}/{stem}.jpg'), vis,
                    [cv2.IMWRITE_JPEG_QUALITY, 92])
        cv2.imwrite(osp.join(root, f'infrared/{split}/{stem}.jpg'), ir,
                    [cv2.IMWRITE_JPEG_QUALITY, 92])
        with open(osp.join(root, 'Annotations', f'{stem}.xml'), 'w',
                  encoding='utf-8') as f:
            f.write(_voc_xml(f'{stem}.jpg', size[0], size[1], boxes))
    return root

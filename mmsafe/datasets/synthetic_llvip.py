"""A deterministic, synthetic LLVIP-like dataset for CPU demos and tests.

The tree has the real LLVIP layout, so the same dataset config reads it and
the real data::

    data_root/
      Annotations/{stem}.xml        VOC xml, class 'person'
      visible/{train,test}/{stem}.jpg
      infrared/{train,test}/{stem}.jpg
      .mmsafe_synthetic.json        what generated it (parameters, version)

Each pair shows 0-4 people (some images have none) that are warm and bright
in infrared and dim, low-contrast in visible, on textured night-time
backgrounds with a few warm distractors (wide, car-like shapes) that are not
people. Every pixel is a function of ``(seed, split, index)`` only, so the
tree is the same on every machine and in every process.

Creation is race-safe: each process builds in its own temporary folder
beside ``data_root`` and renames it into place; a process that loses the
race (another DDP rank was first) deletes its copy and uses the winner's.
"""
import errno
import json
import logging
import os
import os.path as osp
import shutil
import uuid
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

from mmsafe.errors import (MMSafeFileExistsError, MMSafeOSError,
                           MMSafeValueError)
from mmsafe.events import log

MARKER = '.mmsafe_synthetic.json'
# bump when the rendering changes, so stale trees are not reused silently
GENERATOR_VERSION = 1
SPLITS = ('train', 'test')
# LLVIP-like file stems: train 010001..., test 190001...
_STEM_BASE = dict(train=10001, test=190001)
_SPLIT_ID = dict(train=0, test=1)


def synthetic_params(num_train: int = 300,
                     num_test: int = 100,
                     img_size: Sequence[int] = (160, 128),
                     seed: int = 0,
                     max_people: int = 4,
                     empty_ratio: float = 0.15,
                     person_height: Sequence[float] = (14, 60)) -> Dict:
    """Normalised generation parameters (what the marker file records)."""
    width, height = (int(v) for v in img_size)
    lo, hi = (float(v) for v in person_height)
    if width < 32 or height < 32:
        raise MMSafeValueError(
            f'img_size must be at least (32, 32), got {img_size}')
    if not 4 <= lo <= hi:
        raise MMSafeValueError(f'person_height must be (min, max) with '
                               f'4 <= min <= max, got {person_height}')
    if not 0 <= empty_ratio <= 1:
        raise MMSafeValueError(
            f'empty_ratio must be in [0, 1], got {empty_ratio}')
    return dict(
        version=GENERATOR_VERSION,
        num_train=int(num_train),
        num_test=int(num_test),
        img_size=[width, height],
        seed=int(seed),
        max_people=int(max_people),
        empty_ratio=float(empty_ratio),
        person_height=[lo, min(hi, height - 4.0)])


def _smooth_noise(rng: np.random.Generator, width: int, height: int,
                  cell: int, amplitude: float) -> np.ndarray:
    """Low-frequency texture: coarse noise upsampled with bicubic."""
    gw, gh = max(2, width // cell + 2), max(2, height // cell + 2)
    coarse = rng.standard_normal((gh, gw)).astype(np.float32)
    return cv2.resize(coarse, (width, height),
                      interpolation=cv2.INTER_CUBIC) * amplitude


def _person_mask(width: int, height: int, box: Tuple[float, float, float,
                                                     float]) -> np.ndarray:
    """A standing person: head, torso with arms, two legs (uint8 0/255)."""
    x1, y1, w, h = box
    mask = np.zeros((height, width), np.uint8)
    cx = x1 + w / 2.0
    head_r = max(1, int(round(0.11 * h)))
    cv2.circle(mask, (int(round(cx)), int(round(y1 + head_r))), head_r, 255,
               -1)
    torso_top, torso_bottom = y1 + 2 * head_r, y1 + 0.58 * h
    cv2.ellipse(mask, (int(round(cx)),
                       int(round((torso_top + torso_bottom) / 2))),
                (max(1, int(round(w * 0.5))),
                 max(1, int(round((torso_bottom - torso_top) / 2)))), 0, 0,
                360, 255, -1)
    leg_w = max(1, int(round(w * 0.2)))
    for sign in (-1, 1):
        lx = int(round(cx + sign * w * 0.16))
        cv2.rectangle(mask, (lx - leg_w // 2, int(round(torso_bottom - 2))),
                      (lx + leg_w // 2, int(round(y1 + h - 1))), 255, -1)
    return mask


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) *
             (b[3] - b[1]) - inter)
    return inter / union if union > 0 else 0.0


def render_pair(params: Dict, split: str, index: int
                ) -> Tuple[np.ndarray, np.ndarray, List[List[int]]]:
    """Render one aligned pair and its person boxes.

    Args:
        params (dict): output of :func:`synthetic_params`.
        split (str): ``'train'`` or ``'test'``.
        index (int): image index within the split.

    Returns:
        tuple: visible BGR uint8 (H, W, 3), infrared uint8 (H, W, 3) (grey in
        three channels, as LLVIP's jpgs), and boxes ``[x1, y1, x2, y2]`` as
        inclusive pixel coordinates (0-based).
    """
    width, height = params['img_size']
    rng = np.random.default_rng(
        [params['seed'], _SPLIT_ID[split], int(index), 7919])

    # Scene: night-time ground/sky gradient plus shared structures (walls,
    # kerbs) that show in both modalities with different intensities.
    yy = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    ir = (rng.uniform(35, 70) + 25 * yy * rng.uniform(-1, 1) +
          _smooth_noise(rng, width, height, 24, 10) +
          _smooth_noise(rng, width, height, 6, 4)) * np.ones(
              (1, width), np.float32)
    vis_base = rng.uniform(30, 65)
    tint = rng.uniform(-8, 8, size=3).astype(np.float32)
    vis_grey = (vis_base + 20 * yy * rng.uniform(-1, 1) +
                _smooth_noise(rng, width, height, 16, 12) +
                _smooth_noise(rng, width, height, 4, 6))
    vis = vis_grey[..., None] + tint[None, None, :]
    for _ in range(int(rng.integers(1, 5))):
        sw = rng.uniform(0.15, 0.6) * width
        sh = rng.uniform(0.1, 0.45) * height
        sx = rng.uniform(-0.1, 0.9) * width
        sy = rng.uniform(-0.1, 0.8) * height
        region = (slice(max(0, int(sy)), max(0, int(sy + sh))),
                  slice(max(0, int(sx)), max(0, int(sx + sw))))
        vis[region] += rng.uniform(-18, 25)
        ir[region] += rng.uniform(-10, 12)
    # lamps: bright in visible, lukewarm in infrared
    for _ in range(int(rng.integers(0, 3))):
        c = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        r = int(rng.integers(2, 6))
        lamp = np.zeros((height, width), np.float32)
        cv2.circle(lamp, c, r, 1.0, -1)
        lamp = cv2.GaussianBlur(lamp, (0, 0), r)
        vis += lamp[..., None] * rng.uniform(60, 140)
        ir += lamp * rng.uniform(5, 20)
    # warm distractors: wide, car-like, cooler than people
    for _ in range(int(rng.integers(0, 3))):
        dh = rng.uniform(8, 22)
        dw = dh * rng.uniform(1.6, 3.0)
        dx, dy = rng.uniform(0, width - dw), rng.uniform(0, height - dh)
        m = np.zeros((height, width), np.float32)
        cv2.rectangle(m, (int(dx), int(dy)), (int(dx + dw), int(dy + dh)),
                      1.0, -1)
        m = cv2.GaussianBlur(m, (3, 3), 0)
        ir = ir * (1 - m) + m * rng.uniform(95, 135)
        vis = vis * (1 - m[..., None]) + m[..., None] * (
            vis_base + rng.uniform(-20, 30, size=3).astype(np.float32))

    # People.
    boxes: List[List[int]] = []
    if rng.random() >= params['empty_ratio']:
        lo, hi = params['person_height']
        for _ in range(int(rng.integers(1, params['max_people'] + 1))):
            for _try in range(20):
                h = rng.uniform(lo, hi)
                w = h * rng.uniform(0.34, 0.5)
                x1 = rng.uniform(0, width - w - 1)
                y1 = rng.uniform(0, height - h - 1)
                mask = _person_mask(width, height, (x1, y1, w, h))
                ys, xs = np.nonzero(mask)
                if len(xs) == 0:
                    continue
                box = [int(xs.min()), int(ys.min()), int(xs.max()),
                       int(ys.max())]
                if all(_iou(box, b) < 0.2 for b in boxes):
                    break
            else:
                continue
            boxes.append(box)
            alpha = cv2.GaussianBlur(mask.astype(np.float32) / 255.0,
                                     (3, 3), 0)
            # warm body, hotter head and skin, a little internal texture
            temp = rng.uniform(175, 235) + _smooth_noise(
                rng, width, height, 8, 6)
            ir = ir * (1 - alpha) + alpha * temp
            # dim clothes: a small offset from the local background
            cloth = rng.uniform(12, 32) * rng.choice([-1.0, 1.0])
            colour = cloth + rng.uniform(-6, 6, size=3).astype(np.float32)
            vis = vis + alpha[..., None] * colour[None, None, :]

    ir = ir + rng.normal(0, 3, size=ir.shape).astype(np.float32)
    vis = vis + rng.normal(0, 5, size=vis.shape).astype(np.float32)
    ir_u8 = np.clip(np.round(ir), 0, 255).astype(np.uint8)
    vis_u8 = np.clip(np.round(vis), 0, 255).astype(np.uint8)
    return vis_u8, np.repeat(ir_u8[..., None], 3, axis=2), boxes


def _voc_xml(filename: str, width: int, height: int,
             boxes: List[List[int]]) -> str:
    """VOC xml as LLVIP writes it (1-based, inclusive pixel coordinates)."""
    objects = ''.join(
        '\t<object>\n\t\t<name>person</name>\n\t\t<pose>Unspecified</pose>\n'
        '\t\t<truncated>0</truncated>\n\t\t<difficult>0</difficult>\n'
        f'\t\t<bndbox>\n\t\t\t<xmin>{x1 + 1}</xmin>\n\t\t\t<ymin>{y1 + 1}'
        f'</ymin>\n\t\t\t<xmax>{x2 + 1}</xmax>\n\t\t\t<ymax>{y2 + 1}</ymax>'
        '\n\t\t</bndbox>\n\t</object>\n' for x1, y1, x2, y2 in boxes)
    return ('<annotation>\n\t<folder>mmsafe_synthetic_llvip</folder>\n'
            f'\t<filename>{filename}</filename>\n'
            '\t<source>\n\t\t<database>mmsafe synthetic LLVIP</database>\n'
            '\t</source>\n'
            f'\t<size>\n\t\t<width>{width}</width>\n\t\t<height>{height}'
            '</height>\n\t\t<depth>3</depth>\n\t</size>\n'
            f'\t<segmented>0</segmented>\n{objects}</annotation>\n')


def stem_of(split: str, index: int) -> str:
    """LLVIP-style file stem of image ``index`` of ``split``."""
    return f'{_STEM_BASE[split] + index:06d}'


def write_tree(root: str, params: Dict) -> Dict[str, int]:
    """Write the whole synthetic tree under ``root`` (which must not exist).

    Returns:
        dict: number of images and of person boxes per split.
    """
    width, height = params['img_size']
    os.makedirs(osp.join(root, 'Annotations'))
    stats = {}
    for split in SPLITS:
        os.makedirs(osp.join(root, 'visible', split))
        os.makedirs(osp.join(root, 'infrared', split))
        count = params[f'num_{split}']
        num_boxes = 0
        for index in range(count):
            stem = stem_of(split, index)
            vis, ir, boxes = render_pair(params, split, index)
            num_boxes += len(boxes)
            for modality, img in (('visible', vis), ('infrared', ir)):
                path = osp.join(root, modality, split, f'{stem}.jpg')
                if not cv2.imwrite(path, img, [cv2.IMWRITE_JPEG_QUALITY, 92]):
                    raise MMSafeOSError(f'could not write {path}')
            with open(osp.join(root, 'Annotations', f'{stem}.xml'), 'w',
                      encoding='utf-8') as f:
                f.write(_voc_xml(f'{stem}.jpg', width, height, boxes))
        stats[split] = count
        stats[f'{split}_boxes'] = num_boxes
    # the marker is written last: a tree with a marker is complete
    with open(osp.join(root, MARKER), 'w', encoding='utf-8') as f:
        json.dump(params, f, indent=2, sort_keys=True)
    return stats


def _read_marker(root: str) -> Optional[Dict]:
    path = osp.join(root, MARKER)
    if not osp.isfile(path):
        return None
    with open(path, encoding='utf-8') as f:
        return json.load(f)


def ensure_synthetic_llvip(data_root: str, **kwargs) -> str:
    """Create the synthetic LLVIP-like tree at ``data_root`` unless it is
    already there with the same parameters.

    Safe when several processes (DDP ranks) call it at once: each builds in
    a private temporary folder and renames it into place; the losers of the
    race delete their copy and use the winner's tree.

    Args:
        data_root (str): where the tree lives. It must not exist, be an
            empty folder, or hold a synthetic tree made with the same
            parameters; anything else is an error (real data is never
            overwritten).
        **kwargs: generation parameters, see :func:`synthetic_params`
            (``num_train=300, num_test=100, img_size=(160, 128), seed=0,
            max_people=4, empty_ratio=0.15, person_height=(14, 60)``).

    Returns:
        str: ``data_root``.
    """
    params = synthetic_params(**kwargs)
    data_root = osp.normpath(osp.abspath(data_root))

    def existing_ok() -> bool:
        found = _read_marker(data_root)
        if found is None:
            return False
        if found != params:
            raise MMSafeValueError(
                f'{data_root} holds a synthetic LLVIP tree made with other '
                f'parameters:\n  found:  {found}\n  wanted: {params}\n'
                f'Delete the folder (it is regenerated on first use) or point '
                f'data_root somewhere else.')
        return True

    if osp.isdir(data_root):
        if existing_ok():
            log(f'synthetic LLVIP: using existing tree at {data_root}')
            return data_root
        if os.listdir(data_root):
            raise MMSafeFileExistsError(
                f'{data_root} exists and is not a synthetic mmsafe LLVIP tree '
                f'(no {MARKER}); refusing to write synthetic data into it. '
                f'Remove `synthetic=...` from the dataset config to use the '
                f'real data there, or choose another data_root.')
        try:
            os.rmdir(data_root)  # an empty folder is replaced by the tree
        except OSError:
            pass  # another process may have just renamed its tree here

    parent = osp.dirname(data_root)
    os.makedirs(parent, exist_ok=True)
    tmp = osp.join(parent, f'.{osp.basename(data_root)}.tmp-{os.getpid()}-'
                   f'{uuid.uuid4().hex[:8]}')
    log(f'synthetic LLVIP: creating a deterministic demo dataset at '
        f'{data_root} ({params["num_train"]} train + {params["num_test"]} '
        f'test pairs of {params["img_size"][0]}x{params["img_size"][1]}, '
        f'seed {params["seed"]}); it is reused on later runs', logging.WARNING)
    try:
        stats = write_tree(tmp, params)
        try:
            os.rename(tmp, data_root)
        except OSError as e:
            # lost the race: another process renamed its tree first
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY) and not (
                    isinstance(e, FileExistsError)
                    or osp.isdir(data_root)):
                raise
            if not existing_ok():
                raise
            log(f'synthetic LLVIP: another process created {data_root} '
                f'first; using its tree')
            return data_root
    finally:
        if osp.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    log(f'synthetic LLVIP: created {data_root}: {stats}')
    return data_root

"""Fault-injecting datasets and a tiny LLVIP tree writer for the
check_dataset tests (imported by test configs through custom_imports)."""
import os
import os.path as osp
from typing import Dict, Iterable, Optional, Sequence, Tuple

import cv2
import numpy as np

from mmdet.registry import DATASETS
from mmsafe.datasets import LLVIPDataset


@DATASETS.register_module()
class BadLabelLLVIPDataset(LLVIPDataset):
    """LLVIPDataset that maps the boxes of ``bad_label_stems`` to label
    ``len(classes)``, as a dataset with a wrong category mapping does."""

    def __init__(self, *args, bad_label_stems: Sequence[str] = (), **kwargs):
        self.bad_label_stems = tuple(bad_label_stems)
        super().__init__(*args, **kwargs)

    def parse_data_info(self, raw: dict) -> dict:
        info = super().parse_data_info(raw)
        if raw['img_id'] in self.bad_label_stems:
            for inst in info['instances']:
                inst['bbox_label'] = len(self._metainfo['classes'])
        return info


def _image(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, (h, w, 3), dtype=np.uint8)


def infrared_partner(vis: np.ndarray, seed: int) -> np.ndarray:
    """An infrared image registered to ``vis``: the same structure with
    other intensities (inverted, scaled, its own noise), grey in three
    channels as LLVIP stores it."""
    grey = cv2.cvtColor(vis, cv2.COLOR_BGR2GRAY).astype(np.float32)
    noise = np.random.default_rng(seed).normal(0, 12, grey.shape)
    ir = np.clip(230 - 0.7 * grey + noise, 0, 255).astype(np.uint8)
    return cv2.cvtColor(ir, cv2.COLOR_GRAY2BGR)


def with_person(vis: np.ndarray, ir: np.ndarray,
                box: Tuple[int, int, int, int]) -> None:
    """Put a person in ``box`` (in place): a warm body in infrared, a dim
    one in visible, as the per-box check of the pairs expects."""
    x1, y1, x2, y2 = box
    centre = ((x1 + x2) // 2, (y1 + y2) // 2)
    axes = (max(1, (x2 - x1) // 3), max(1, (y2 - y1) * 2 // 5))
    body = np.zeros(vis.shape[:2], np.uint8)
    cv2.ellipse(body, centre, axes, 0, 0, 360, 1, -1)
    inside = body.astype(bool)
    ir[inside] = 245
    vis[inside] = (vis[inside] * 0.6).astype(np.uint8)


def _xml(stem: str, w: int, h: int,
         boxes: Iterable[Tuple[int, int, int, int]]) -> str:
    objs = ''.join(
        '<object><name>person</name><difficult>0</difficult><bndbox>'
        f'<xmin>{b[0]}</xmin><ymin>{b[1]}</ymin><xmax>{b[2]}</xmax>'
        f'<ymax>{b[3]}</ymax></bndbox></object>' for b in boxes)
    return (f'<annotation><filename>{stem}.jpg</filename><size><width>{w}'
            f'</width><height>{h}</height><depth>3</depth></size>{objs}'
            '</annotation>')


def write_llvip_tree(root: str,
                     num: int = 6,
                     size: Tuple[int, int] = (64, 48),
                     faults: Optional[Dict[str, str]] = None,
                     split: str = 'train') -> Dict[str, str]:
    """Write ``num`` pairs in the LLVIP layout; ``faults`` maps a stem to one
    of ``missing_partner``, ``unreadable``, ``size_mismatch``, ``empty``,
    ``degenerate``, ``out_of_image`` (``label`` faults come from
    :class:`BadLabelLLVIPDataset`). Returns ``{stem: fault}``."""
    faults = dict(faults or {})
    w, h = size
    for sub in ('Annotations', f'visible/{split}', f'infrared/{split}'):
        os.makedirs(osp.join(root, sub), exist_ok=True)
    for i in range(num):
        stem = f'{i + 1:06d}'
        fault = faults.get(stem)
        vis = _image(w, h, i)
        ir = infrared_partner(vis, 1000 + i)
        box = (w // 4, h // 4, w // 2, h // 2 + 8)
        with_person(vis, ir, box)
        boxes = [box]
        if fault == 'empty':
            boxes = []
        elif fault == 'degenerate':
            boxes = [box, (20, 10, 20, 30)]
        elif fault == 'out_of_image':
            boxes = [(w // 2, h // 4, w + 30, h // 2)]
        cv2.imwrite(osp.join(root, f'visible/{split}/{stem}.jpg'), vis)
        ir_path = osp.join(root, f'infrared/{split}/{stem}.jpg')
        if fault == 'unreadable':
            with open(ir_path, 'wb') as f:
                f.write(b'this is not a jpeg' * 10)
        elif fault == 'size_mismatch':
            cv2.imwrite(ir_path, cv2.resize(ir, (w + 16, h + 16)))
        elif fault != 'missing_partner':
            cv2.imwrite(ir_path, ir)
        with open(osp.join(root, f'Annotations/{stem}.xml'), 'w') as f:
            f.write(_xml(stem, w, h, boxes))
    return faults


CONFIG = """
custom_imports = dict(
    imports=['mmsafe', 'tests.tools.check_dataset_toys'],
    allow_failed_imports=False)
default_scope = 'mmsafe'
train_pipeline = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedResize', scale=(96, 72), keep_ratio=True),
    dict(type='PairedRandomFlip', prob=0.5),
    dict(type='PackPairedDetInputs')
]
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        type='{dataset_type}',
        data_root={data_root!r},
        data_prefix=dict(img='visible/train/', ann='Annotations/'),
        filter_cfg=None,
        pipeline=train_pipeline{extra}))
"""


def write_config(path: str, data_root: str,
                 dataset_type: str = 'LLVIPDataset', extra: str = '',
                 wrap: Optional[str] = None) -> str:
    """Write a training config for the tree; ``wrap`` names a dataset
    wrapper type put around the dataset (``wrap(dataset=...)``)."""
    text = CONFIG.format(dataset_type=dataset_type, data_root=data_root,
                         extra=extra)
    if wrap:
        text += ("train_dataloader['dataset'] = dict(type=%r, "
                 "dataset=train_dataloader['dataset'])\n" % wrap)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(text)
    return path


#: the CPU demo's generator settings (configs/llvip/demo_cpu.py), fewer
#: images
DEMO_SYNTHETIC = dict(num_train=24, num_test=4, img_size=(160, 128), seed=0,
                      max_people=5, empty_ratio=0.25,
                      person_height=(30, 110))


def synthetic_demo_tree(root: str, fault: Optional[str] = None) -> str:
    """The synthetic demo tree at ``root``; ``fault``: ``'mirrored'`` (every
    infrared file flipped left-right on disk) or ``'permuted'`` (every
    visible image gets the next image's infrared file)."""
    import glob
    from mmsafe.datasets.synthetic_llvip import ensure_synthetic_llvip
    ensure_synthetic_llvip(root, **DEMO_SYNTHETIC)
    files = sorted(glob.glob(osp.join(root, 'infrared', 'train', '*.jpg')))
    if fault == 'mirrored':
        for path in files:
            assert cv2.imwrite(path, cv2.imread(path)[:, ::-1])
    elif fault == 'permuted':
        images = [cv2.imread(p) for p in files]
        for path, img in zip(files, images[1:] + images[:1]):
            assert cv2.imwrite(path, img)
    elif fault is not None:
        raise ValueError(f'unknown fault {fault!r}')
    return root

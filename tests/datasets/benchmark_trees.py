"""Tiny synthetic KAIST, aligned FLIR and M3FD trees in their released
layouts and annotation formats, for the dataset tests.

The pairs come from mmsafe's synthetic LLVIP renderer (people warm in
infrared, dim in visible), so the tiny detector has something to learn;
only the folders, file names and annotation files differ per benchmark.
"""
import os
import os.path as osp
from typing import Dict, List, Sequence, Tuple

import cv2

from mmsafe.datasets.m3fd import M3FD_CLASSES as M3FD_DATASET_CLASSES
from mmsafe.datasets.synthetic_llvip import render_pair, synthetic_params

IMG_SIZE = (96, 80)


def _pairs(num: int, split: str, seed: int = 0):
    params = synthetic_params(num_train=num, num_test=num, img_size=IMG_SIZE,
                              seed=seed, max_people=3, empty_ratio=0.0,
                              person_height=(24, 60))
    for i in range(num):
        yield render_pair(params, split, i)


def _write(path: str, img) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    assert cv2.imwrite(path, img), path


def _text(path: str, text: str) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(text)


def voc(filename: str, objects: Sequence[Tuple[str, List[int]]],
        base: int = 1) -> str:
    """VOC xml with inclusive pixel coordinates counted from ``base`` (1:
    PASCAL VOC and M3FD, 0: the aligned FLIR release)."""
    objs = ''.join(
        f'<object><name>{name}</name><pose>Unspecified</pose><truncated>0'
        f'</truncated><difficult>0</difficult><bndbox><xmin>{b[0] + base}'
        f'</xmin><ymin>{b[1] + base}</ymin><xmax>{b[2] + base}</xmax><ymax>'
        f'{b[3] + base}</ymax></bndbox></object>' for name, b in objects)
    w, h = IMG_SIZE
    return (f'<annotation><folder>data</folder><filename>{filename}'
            f'</filename><size><width>{w}</width><height>{h}</height>'
            f'<depth>3</depth></size><segmented>0</segmented>{objs}'
            '</annotation>\n')


def build_kaist(root: str, num_train: int = 6, num_test: int = 4) -> Dict:
    """``images/setXX/V000/{visible,lwir}/I*.jpg``, bbGt text annotations in
    ``annotations/setXX/V000/I*.txt``, lists in ``imageSets/``.

    Each frame also gets a ``people`` box and a 10 px ``person`` (both
    ignore regions under the tests' setting). Returns the list lines.
    """
    lines = dict(train=[], test=[])
    for split, set_id, num in (('train', 'set00', num_train),
                               ('test', 'set06', num_test)):
        for i, (vis, ir, boxes) in enumerate(_pairs(num, split)):
            frame = f'I{2 * i:05d}'
            folder = osp.join(root, 'images', set_id, 'V000')
            _write(osp.join(folder, 'visible', frame + '.jpg'), vis)
            _write(osp.join(folder, 'lwir', frame + '.jpg'), ir)
            rows = ['% bbGt version=3']
            for x1, y1, x2, y2 in boxes:
                rows.append(f'person {x1} {y1} {x2 - x1 + 1} {y2 - y1 + 1} '
                            '0 0 0 0 0 0 0')
            rows.append('people 2 2 20 12 0 0 0 0 0 0 0')
            rows.append('person 70 2 6 10 0 0 0 0 0 0 0')
            _text(osp.join(root, 'annotations', set_id, 'V000',
                           frame + '.txt'), '\n'.join(rows) + '\n')
            lines[split].append(f'{set_id}/V000/{frame}')
    _text(osp.join(root, 'imageSets', 'train-all-02.txt'),
          '\n'.join(lines['train']) + '\n')
    _text(osp.join(root, 'imageSets', 'test-all-20.txt'),
          '\n'.join(lines['test']) + '\n')
    return lines


FLIR_CLASSES = ('person', 'car', 'bicycle')


def build_flir(root: str, num_train: int = 6, num_test: int = 4) -> Dict:
    """``JPEGImages/FLIR_n_RGB.jpg`` + ``FLIR_n_PreviewData.jpeg``,
    ``Annotations/FLIR_n_PreviewData.xml``, ``align_train.txt`` (plain
    frame ids) and ``align_validation.txt`` (``FLIR_n_PreviewData``)."""
    ids = dict(train=[], test=[])
    n = 1
    for split, num in (('train', num_train), ('test', num_test)):
        for i, (vis, ir, boxes) in enumerate(_pairs(num, split)):
            frame = f'FLIR_{n:05d}'
            n += 1
            _write(osp.join(root, 'JPEGImages', frame + '_RGB.jpg'), vis)
            _write(osp.join(root, 'JPEGImages', frame + '_PreviewData.jpeg'),
                   ir)
            objects = [(FLIR_CLASSES[k % 3], b) for k, b in enumerate(boxes)]
            objects.append(('dog', [1, 1, 10, 10]))  # not a class: skipped
            _text(osp.join(root, 'Annotations', frame + '_PreviewData.xml'),
                  voc(frame + '_PreviewData.jpeg', objects, base=0))
            ids[split].append(frame)
    _text(osp.join(root, 'align_train.txt'), '\n'.join(ids['train']) + '\n')
    _text(osp.join(root, 'align_validation.txt'),
          '\n'.join(f + '_PreviewData' for f in ids['test']) + '\n')
    return ids


M3FD_CLASSES = M3FD_DATASET_CLASSES


def build_m3fd(root: str, num_train: int = 6, num_test: int = 4) -> Dict:
    """``Vis/NNNNN.png``, ``Ir/NNNNN.png``, ``Annotation/NNNNN.xml`` and
    the split lists ``ImageSets/{train,val}.txt``."""
    stems = dict(train=[], test=[])
    n = 0
    for split, num in (('train', num_train), ('test', num_test)):
        for i, (vis, ir, boxes) in enumerate(_pairs(num, split)):
            stem = f'{n:05d}'
            n += 1
            _write(osp.join(root, 'Vis', stem + '.png'), vis)
            _write(osp.join(root, 'Ir', stem + '.png'), ir)
            objects = [(M3FD_CLASSES[k % 6], b) for k, b in enumerate(boxes)]
            _text(osp.join(root, 'Annotation', stem + '.xml'),
                  voc(stem + '.png', objects))
            stems[split].append(stem)
    _text(osp.join(root, 'ImageSets', 'train.txt'),
          '\n'.join(stems['train']) + '\n')
    _text(osp.join(root, 'ImageSets', 'val.txt'),
          '\n'.join(stems['test']) + '\n')
    return stems

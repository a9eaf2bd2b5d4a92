"""Tiny on-disk datasets in real layouts (LLVIP, VOC, COCO) for the tests.

Each image of a pair gets a different, recognisable content (visible: a
horizontal gradient; infrared: a vertical one) so a test can tell which file
was loaded into which key.
"""
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

Box = Tuple[int, int, int, int]


def visible_image(w: int, h: int, seed: int = 0) -> np.ndarray:
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 0] = np.linspace(0, 200, w, dtype=np.uint8)[None, :]
    img[..., 1] = (seed * 37) % 255
    img[..., 2] = 40
    return img


def infrared_image(w: int, h: int, seed: int = 0) -> np.ndarray:
    col = np.linspace(0, 200, h, dtype=np.uint8)[:, None]
    return np.repeat(np.repeat(col, w, 1)[..., None], 3, 2)


def voc_xml(filename: str, w: int, h: int,
            objects: Sequence[Tuple[str, Box, int]],
            extra: str = '') -> str:
    objs = ''.join(
        f'<object><name>{name}</name><difficult>{difficult}</difficult>'
        f'<bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin><xmax>{b[2]}</xmax>'
        f'<ymax>{b[3]}</ymax></bndbox></object>'
        for name, b, difficult in objects)
    return (f'<annotation><filename>{filename}</filename>{extra}<size>'
            f'<width>{w}</width><height>{h}</height><depth>3</depth></size>'
            f'{objs}</annotation>')


def write_img(path: str, img: np.ndarray) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    # png: lossless, so tests can compare pixels exactly
    assert cv2.imwrite(path, img), path


def make_llvip_tree(root: str,
                    split: str = 'train',
                    specs: Optional[Dict[str, dict]] = None,
                    ext: str = '.png') -> Dict[str, dict]:
    """LLVIP layout: Annotations/, visible/{split}/, infrared/{split}/.

    ``specs`` maps stem -> dict(size=(w, h), objects=[(name, box, difficult)]).
    Default: five images, one of them without people, one with a
    ``difficult`` person and a non-person object.
    """
    if specs is None:
        specs = {
            '010001': dict(size=(64, 48), objects=[('person', (5, 6, 20, 40),
                                                    0)]),
            '010002': dict(size=(64, 48), objects=[]),
            '010003': dict(size=(80, 40), objects=[
                ('person', (10, 5, 30, 35), 0), ('person', (40, 5, 50, 30), 1),
                ('car', (1, 1, 9, 9), 0)]),
            '010004': dict(size=(64, 48), objects=[('person', (30, 10, 50, 44),
                                                    0)]),
            '010005': dict(size=(48, 64), objects=[('person', (2, 2, 12, 30),
                                                    0)]),
        }
    for i, (stem, spec) in enumerate(sorted(specs.items())):
        w, h = spec['size']
        write_img(osp.join(root, 'visible', split, stem + ext),
                  visible_image(w, h, i))
        write_img(osp.join(root, 'infrared', split, stem + ext),
                  infrared_image(w, h, i))
        os.makedirs(osp.join(root, 'Annotations'), exist_ok=True)
        with open(osp.join(root, 'Annotations', stem + '.xml'), 'w') as f:
            f.write(voc_xml(stem + ext, w, h, spec['objects']))
    return specs


def make_voc_tree(root: str, stems: Sequence[str], w: int = 64,
                  h: int = 48) -> None:
    """VOC2007 layout with an extra ``InfraredImages`` folder and an
    ``<ir_filename>`` field in each xml."""
    voc = osp.join(root, 'VOC2007')
    os.makedirs(osp.join(voc, 'ImageSets', 'Main'), exist_ok=True)
    os.makedirs(osp.join(voc, 'Annotations'), exist_ok=True)
    for i, stem in enumerate(stems):
        write_img(osp.join(voc, 'JPEGImages', stem + '.jpg'),
                  visible_image(w, h, i))
        write_img(osp.join(voc, 'InfraredImages', stem + '.jpg'),
                  infrared_image(w, h, i))
        with open(osp.join(voc, 'Annotations', stem + '.xml'), 'w') as f:
            f.write(
                voc_xml(stem + '.jpg', w, h, [('person', (4, 4, 30, 40), 0)],
                        extra=f'<ir_filename>../InfraredImages/{stem}.jpg'
                        '</ir_filename>'))
    with open(osp.join(voc, 'ImageSets', 'Main', 'train.txt'), 'w') as f:
        f.write('\n'.join(stems) + '\n')


def make_coco_tree(root: str, names: Sequence[str], w: int = 64,
                   h: int = 48) -> str:
    """COCO layout: images/visible/*.jpg, images/lwir/*.jpg and
    annotations/train.json whose image entries carry ``ir_file_name``."""
    images: List[dict] = []
    anns: List[dict] = []
    for i, name in enumerate(names):
        write_img(osp.join(root, 'images', 'visible', name),
                  visible_image(w, h, i))
        write_img(osp.join(root, 'images', 'lwir', name),
                  infrared_image(w, h, i))
        images.append(dict(id=i + 1, file_name=name, width=w, height=h,
                           ir_file_name=f'../lwir/{name}'))
        anns.append(dict(id=i + 1, image_id=i + 1, category_id=1,
                         bbox=[4, 4, 20, 30], area=600, iscrowd=0))
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    path = osp.join(root, 'annotations', 'train.json')
    with open(path, 'w') as f:
        json.dump(dict(images=images, annotations=anns,
                       categories=[dict(id=1, name='person')]), f)
    return path

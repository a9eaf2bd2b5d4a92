"""Tiny KAIST trees in the real annotation formats, written the way the
releases write them (checked against the real files, see
docs/user_guides/datasets.md):

- kaist-cvpr15 ``annotations-xml-new/setNN/VNNN/INNNNN.xml`` (VOC-like
  header, ``<bndbox><x><y><w><h>``, ``<occlusion>``) with ``imageSets``
  lists in CRLF;
- bbGt text (``% bbGt version=3`` then ``label x y w h occ vx vy vw vh ign
  ang``) per frame, flat (``setNN_VNNN_INNNNN.txt``, the sanitized and
  improved annotations) or per modality (KAIST-Paired).

An object is ``(label, x, y, w, h, occ)`` or ``(label, x, y, w, h, occ,
ign)``.
"""
import os
import os.path as osp
from typing import Dict, Iterable, List, Sequence

import cv2
import numpy as np

XML_HEAD = """<annotation>
  <folder>KAIST Multispectral Ped Benchmark</folder>
  <filename>{frame}</filename>
  <source>
    <database>KAIST pedestrian</database>
    <annotation>KAIST pedestrian</annotation>
    <image>KAIST pedestrian</image>
    <url>https://soonminhwang.github.io/rgbt-ped-detection/</url>
  </source>
  <size>
    <width>640</width>
    <height>512</height>
    <depth>4</depth>
  </size>
  <segmented>0</segmented>
"""
XML_OBJECT = """  <object>
    <name>{0}</name>
    <bndbox>
      <x>{1}</x>
      <y>{2}</y>
      <w>{3}</w>
      <h>{4}</h>
    </bndbox>
    <pose>unknown</pose>
    <truncated>0</truncated>
    <difficult>0</difficult>
    <occlusion>{5}</occlusion>
  </object>
"""


def write(path: str, text: str, newline: str = '\n') -> str:
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8', newline=newline) as f:
        f.write(text)
    return path


def kaist_xml(frame: str, objects: Iterable[Sequence]) -> str:
    """An ``annotations-xml-new`` file of frame ``setNN/VNNN/INNNNN``."""
    body = ''.join(XML_OBJECT.format(*o[:6]) for o in objects)
    return XML_HEAD.format(frame=frame) + body + '</annotation>\n'


def bbgt(objects: Iterable[Sequence]) -> str:
    """A bbGt version 3 text annotation."""
    rows = ['% bbGt version=3']
    for o in objects:
        ign = o[6] if len(o) > 6 else 0
        rows.append(f'{o[0]} {o[1]} {o[2]} {o[3]} {o[4]} {o[5]} 0 0 0 0 '
                    f'{ign} 0')
    return '\n'.join(rows) + '\n'


def write_images(root: str, frames: Iterable[str],
                 size: Sequence[int] = (8, 8)) -> None:
    """A black visible + lwir jpg pair of ``size`` (w, h) per frame (the
    datasets check that both exist; the default img_shape means they are
    never decoded; tiny unless the test reads their size)."""
    img = np.zeros((size[1], size[0], 3), np.uint8)
    for frame in frames:
        set_id, video, name = frame.split('/')
        for modality in ('visible', 'lwir'):
            path = osp.join(root, 'images', set_id, video, modality,
                            name + '.jpg')
            os.makedirs(osp.dirname(path), exist_ok=True)
            assert cv2.imwrite(path, img), path


def write_list(root: str, name: str, frames: Sequence[str]) -> str:
    """``imageSets/<name>`` with CRLF endings, as kaist-cvpr15 ships it."""
    return write(osp.join(root, 'imageSets', name),
                 ''.join(f + '\r\n' for f in frames), newline='')


def xml_tree(root: str, annotations: Dict[str, List[Sequence]],
             lists: Dict[str, Sequence[str]], images: bool = True) -> None:
    """A kaist-cvpr15 tree: ``annotations-xml-new``, CRLF ``imageSets``."""
    for frame, objects in annotations.items():
        write(osp.join(root, 'annotations-xml-new', frame + '.xml'),
              kaist_xml(frame, objects))
    for name, frames in lists.items():
        write_list(root, name, frames)
    if images:
        write_images(root, annotations)


def flat_folder(folder: str, annotations: Dict[str, List[Sequence]]) -> None:
    """Flat bbGt files ``setNN_VNNN_INNNNN.txt`` in ``folder``."""
    for frame, objects in annotations.items():
        write(osp.join(folder, frame.replace('/', '_') + '.txt'),
              bbgt(objects))


def paired_folder(folder: str, visible: Dict[str, List[Sequence]],
                  infrared: Dict[str, List[Sequence]]) -> None:
    """KAIST-Paired: ``setNN/VNNN/{visible,lwir}/INNNNN.txt``."""
    for modality, annotations in (('visible', visible), ('lwir', infrared)):
        for frame, objects in annotations.items():
            set_id, video, name = frame.split('/')
            write(osp.join(folder, set_id, video, modality, name + '.txt'),
                  bbgt(objects))

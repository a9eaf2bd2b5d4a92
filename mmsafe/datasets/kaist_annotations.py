"""KAIST annotation releases: their file layouts and readers.

Every release gives per object a label (``person``, ``people``,
``cyclist``, ``person?`` ...), a box ``x y w h`` in pixels from the
frame's top-left corner and an occlusion level (0 none, 1 partial,
2 heavy). A box is read as ``[x, y, x + w, y + h]``: on the 109,629 boxes
of the kaist-cvpr15 ``annotations-xml-new`` release, ``x = 0`` occurs 955
times and ``x + w = 640`` (the right edge of a 640 px frame) 1,206 times
against 25 times 641, so ``x, y`` are 0-based and ``x + w`` is the right
edge. The KAIST devkit compares detections with these numbers as they are.

Layouts (``ann_layout``), inside the annotation folder:

- ``'bbgt'``: ``setNN/VNNN/INNNNN.txt``, Dollar's bbGt text (the original
  release's ``annotations/``).
- ``'flat'``: ``setNN_VNNN_INNNNN.txt``, bbGt text (the sanitized training
  and improved test annotations).
- ``'xml'``: ``setNN/VNNN/INNNNN.xml`` (kaist-cvpr15's
  ``annotations-xml-new``: ``<object><name>``, ``<bndbox><x><y><w><h>``,
  ``<occlusion>``).
- ``'paired'``: ``setNN/VNNN/{visible,lwir}/INNNNN.txt``, bbGt text per
  modality, the i-th object of one file the i-th of the other (AR-CNN's
  KAIST-Paired).
"""
import os.path as osp
import xml.etree.ElementTree as ET
from typing import Dict, List, Sequence, Tuple

from mmsafe.errors import MMSafeValueError

#: layout name -> (annotation file template, what it is)
LAYOUTS: Dict[str, Tuple[str, str]] = {
    'bbgt': ('{set}/{video}/{frame}.txt', 'bbGt text per frame'),
    'flat': ('{set}_{video}_{frame}.txt', 'flat bbGt text'),
    'xml': ('{set}/{video}/{frame}.xml', 'annotations-xml-new xml'),
    'paired': ('{set}/{video}/{modality}/{frame}.txt',
               'KAIST-Paired bbGt text per modality'),
}
#: annotation folders tried, in this order, when data_prefix has no 'ann'
ANN_FOLDERS = ('annotations/', 'annotations-xml-new/', 'annotations_paired/')
#: modality folder names of the paired layout
PAIRED_MODALITIES = ('visible', 'lwir')


def _obj(label: str, x: float, y: float, w: float, h: float, occ: int,
         ign: int) -> dict:
    return dict(label=label, bbox=[x, y, x + w, y + h], occlusion=occ,
                ign=ign)


def parse_bbgt(text: str, source: str = '') -> List[dict]:
    """Objects of a bbGt text annotation.

    Each line after the ``% bbGt version=3`` header is
    ``label x y w h occ vx vy vw vh ign ang`` (version 3; the last two are
    missing in older versions, the last eight may be missing altogether).

    Returns:
        list[dict]: ``label``, ``bbox`` (``x, y, x + w, y + h``),
        ``occlusion`` and ``ign`` (the bbGt ignore flag, 0 when absent).
    """
    objects = []
    for num, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('%'):
            continue
        parts = line.split()
        try:
            x, y, w, h = (float(v) for v in parts[1:5])
            occ = int(float(parts[5])) if len(parts) > 5 else 0
            ign = int(float(parts[10])) if len(parts) > 10 else 0
        except (ValueError, IndexError) as err:
            raise MMSafeValueError(
                f'KAISTDataset: {source}:{num}: expected "label x y w h '
                f'[occ vx vy vw vh ign ang]", got {line!r}') from err
        objects.append(_obj(parts[0], x, y, w, h, occ, ign))
    return objects


def _number(node: ET.Element, tag: str, source: str, default=None) -> float:
    child = node.find(tag)
    if child is None or child.text is None:
        if default is not None:
            return default
        raise MMSafeValueError(
            f'KAISTDataset: {source}: an object has no <{tag}>')
    try:
        return float(child.text)
    except ValueError as err:
        raise MMSafeValueError(f'KAISTDataset: {source}: <{tag}> is '
                               f'{child.text!r}, not a number') from err


def parse_kaist_xml(text: str, source: str = '') -> List[dict]:
    """Objects of an ``annotations-xml-new`` file.

    ``<object><name>`` is the label, ``<bndbox>`` holds ``<x><y><w><h>``
    (or ``<xmin><ymin><xmax><ymax>``, as the KAIST repository's converter
    writes them), ``<occlusion>`` the level (0 when absent) and
    ``<difficult>`` is read as the ignore flag (all 0 in the release).

    Returns:
        list[dict]: as :func:`parse_bbgt`.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise MMSafeValueError(
            f'KAISTDataset: {source}: not valid xml ({err})') from err
    objects = []
    for node in root.iter('object'):
        name = node.find('name')
        box = node.find('bndbox')
        if name is None or not (name.text or '').strip() or box is None:
            raise MMSafeValueError(
                f'KAISTDataset: {source}: an <object> needs '
                '<name> and <bndbox>')
        if box.find('x') is not None:
            x, y, w, h = (_number(box, k, source) for k in 'xywh')
        else:
            x1, y1, x2, y2 = (_number(box, k, source)
                              for k in ('xmin', 'ymin', 'xmax', 'ymax'))
            x, y, w, h = x1, y1, x2 - x1, y2 - y1
        objects.append(_obj(name.text.strip(), x, y, w, h,
                            int(_number(node, 'occlusion', source, 0)),
                            int(_number(node, 'difficult', source, 0))))
    return objects


def pair_objects(visible: Sequence[dict], infrared: Sequence[dict],
                 sources: Sequence[str]) -> List[Tuple[dict, dict]]:
    """The KAIST-Paired objects of one frame, visible and infrared side by
    side (the i-th of each file)."""
    if len(visible) != len(infrared):
        raise MMSafeValueError(
            f'KAISTDataset: {sources[0]} has {len(visible)} objects and '
            f'{sources[1]} {len(infrared)}; KAIST-Paired files list the '
            'same objects in the same order')
    return list(zip(visible, infrared))


def layout_files(layout: str, template: str, folder: str, set_id: str,
                 video: str, frame: str) -> List[str]:
    """The annotation file(s) of a frame: one, or two (visible, infrared)
    for the paired layout."""
    names = dict(set=set_id, video=video, frame=frame)
    if layout == 'paired':
        return [osp.join(folder, template.format(modality=m, **names))
                for m in PAIRED_MODALITIES]
    return [osp.join(folder, template.format(**names))]

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
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .annotation_reader import (MalformedAnnotationError, XMLFields,
                                decode_text, parse_xml, read_number)

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
#: the labels the releases use: ``person`` (the class), the devkit's
#: ignore-region labels and ``person?a`` (the improved test annotations)
KAIST_LABELS = ('person', 'people', 'person?', 'cyclist', 'person?a')
#: occlusion levels (0 none, 1 partial, 2 heavy) and bbGt ignore flags
OCCLUSIONS = (0, 1, 2)
IGN_FLAGS = (0, 1)
#: how the releases write their files, for messages
BBGT_FORMAT = ('KAIST bbGt text (version 3): after the "% bbGt" header, '
               'one object per line, "label x y w h occ vx vy vw vh ign '
               'ang", numbers with a decimal point, occ 0, 1 or 2, ign 0 or '
               '1 (the fields after h may be missing: occ and ign read 0)')
XML_FORMAT = "kaist-cvpr15's annotations-xml-new"
XML_FIELDS = dict(
    name='<name> holds the label (person, people, person?, cyclist)',
    box='<bndbox> holds <x>, <y>, <w>, <h> (or <xmin>, <ymin>, <xmax>, '
    '<ymax>), pixels written with a decimal point',
    occlusion='<occlusion> is 0, 1 or 2 (missing or empty: 0)',
    difficult='<difficult> is 0 or 1 (missing or empty: 0)')
#: the documented defaults, for the counts
DEFAULTS = dict(occlusion='0 (no occlusion)', ign='0 (not ignored)',
                difficult='0 (not ignored)')

#: called with a field's name when its documented default is applied
OnDefault = Optional[Callable[[str], None]]


def _obj(label: str, x: float, y: float, w: float, h: float, occ: int,
         ign: int) -> dict:
    return dict(label=label, bbox=[x, y, x + w, y + h], occlusion=occ,
                ign=ign)


def _bbgt_field(value: str, name: str, allowed: Optional[Sequence[int]],
                source: str, num: int) -> float:
    """One numeric field of a bbGt line (``allowed``: its integer values)."""
    try:
        number = read_number(value)
    except ValueError as err:
        if allowed is None:
            raise MalformedAnnotationError.at(source, f'field {name}', num,
                                              str(err), BBGT_FORMAT) from None
        number = None
    if allowed is not None and (number is None or number != int(number)
                                or int(number) not in allowed):
        raise MalformedAnnotationError.at(
            source, f'field {name}', num, f'is {value!r}, not one of '
            f'{", ".join(str(a) for a in allowed)}', BBGT_FORMAT)
    return number


def parse_bbgt(text: Union[str, bytes], source: str = '',
               on_default: OnDefault = None) -> List[dict]:
    """Objects of a bbGt text annotation.

    Each line after the ``% bbGt version=3`` header is
    ``label x y w h occ vx vy vw vh ign ang`` (version 3; the last two are
    missing in older versions, the last eight may be missing altogether).

    Args:
        text (str | bytes): the file's content (bytes: UTF-8).
        source (str): the file, for messages.
        on_default (callable, optional): called with ``'occlusion'`` or
            ``'ign'`` for each field missing from a line (read as 0).

    Returns:
        list[dict]: ``label``, ``bbox`` (``x, y, x + w, y + h``),
        ``occlusion`` and ``ign`` (the bbGt ignore flag, 0 when absent).

    Raises:
        MalformedAnnotationError: a field is malformed (named with its
            line), or the bytes are not UTF-8.
    """
    if isinstance(text, bytes):
        text = decode_text(text, source, BBGT_FORMAT)
    objects = []
    for num, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('%'):
            continue
        parts = line.split()
        if len(parts) < 5:
            raise MalformedAnnotationError.at(
                source, 'the object line', num,
                f'has {len(parts)} fields ({line!r}); a line needs at least '
                '"label x y w h"', BBGT_FORMAT)
        x, y, w, h = (_bbgt_field(v, k, None, source, num)
                      for k, v in zip('xywh', parts[1:5]))
        occ = ign = 0
        if len(parts) > 5:
            occ = int(_bbgt_field(parts[5], 'occ', OCCLUSIONS, source, num))
        elif on_default is not None:
            on_default('occlusion')
        if len(parts) > 10:
            ign = int(_bbgt_field(parts[10], 'ign', IGN_FLAGS, source, num))
        elif on_default is not None:
            on_default('ign')
        objects.append(_obj(parts[0], x, y, w, h, occ, ign))
    return objects


def _xml_box(doc: XMLFields, node) -> Tuple[float, float, float, float]:
    """``x, y, w, h`` of an object's ``<bndbox>``."""
    box = node.find('bndbox')
    convention = XML_FIELDS['box']
    if box is None:
        raise doc.error('<object>', doc.line(node), 'has no <bndbox>',
                        convention)
    if box.find('x') is not None:
        x, y, w, h = (doc.number(box, k, convention) for k in 'xywh')
        return x, y, w, h
    x1, y1, x2, y2 = (doc.number(box, k, convention)
                      for k in ('xmin', 'ymin', 'xmax', 'ymax'))
    return x1, y1, x2 - x1, y2 - y1


def parse_kaist_xml(text: Union[str, bytes], source: str = '',
                    on_default: OnDefault = None) -> List[dict]:
    """Objects of an ``annotations-xml-new`` file.

    ``<object><name>`` is the label, ``<bndbox>`` holds ``<x><y><w><h>``
    (or ``<xmin><ymin><xmax><ymax>``, as the KAIST repository's converter
    writes them), ``<occlusion>`` the level (0 when absent) and
    ``<difficult>`` is read as the ignore flag (all 0 in the release).

    Args:
        text (str | bytes): the file's content (bytes: in the encoding its
            declaration names, UTF-8 without one).
        source (str): the file, for messages.
        on_default (callable, optional): called with ``'occlusion'`` or
            ``'difficult'`` for each such element missing or empty (read
            as 0).

    Returns:
        list[dict]: as :func:`parse_bbgt`.

    Raises:
        MalformedAnnotationError: the file is not well-formed xml or a
            field is malformed, naming the element and its line.
    """
    doc = parse_xml(text, source, XML_FORMAT)
    objects = []
    for node in doc.root.iter('object'):
        label = doc.text(node, 'name', XML_FIELDS['name'])
        x, y, w, h = _xml_box(doc, node)
        occ = doc.optional_int(node, 'occlusion', OCCLUSIONS, 0,
                               XML_FIELDS['occlusion'], on_default)
        ign = doc.optional_int(node, 'difficult', IGN_FLAGS, 0,
                               XML_FIELDS['difficult'], on_default)
        objects.append(_obj(label, x, y, w, h, occ, ign))
    return objects


def pair_objects(visible: Sequence[dict], infrared: Sequence[dict],
                 sources: Sequence[str]) -> List[Tuple[dict, dict]]:
    """The KAIST-Paired objects of one frame, visible and infrared side by
    side (the i-th of each file).

    Raises:
        MalformedAnnotationError: the two files list different numbers of
            objects.
    """
    if len(visible) != len(infrared):
        raise MalformedAnnotationError.at(
            sources[0], 'the object list', None,
            f'has {len(visible)} objects and {sources[1]} {len(infrared)}',
            'KAIST-Paired files list the same objects in the same order in '
            'both modalities.')
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

"""The fields of a VOC-style xml as LLVIP, the aligned FLIR release and
M3FD write them, each read with the format's convention
(:mod:`.annotation_reader`).

Fields read, and their convention:

* ``<size><width>``/``<height>``: the frame of the boxes, whole pixels;
  missing, empty or 0 means "the image file's size" (some tools write 0);
* ``<object><name>``: the class name, required;
* ``<object><difficult>``: 0 or 1; missing or empty is 0 (PASCAL VOC's
  default), counted;
* ``<object><bndbox>`` ``<xmin><ymin><xmax><ymax>``: numbers with a
  decimal point, in the release's coordinate base (:mod:`.box_frame`).

Objects whose name is not a class are counted by name (and not read
further: mmsafe reads nothing else of them).
"""
from typing import List, Optional, Tuple

from .annotation_reader import XMLFields
from .annotation_tally import AnnotationTally, ClassNames

#: how the format writes each field, for messages
FIELD_CONVENTIONS = dict(
    name="<name> holds the object's class name as text",
    difficult='<difficult> is 0 or 1 (missing or empty: 0, not difficult)',
    size='<size> holds <width> and <height>, whole numbers of pixels '
    "(missing, empty or 0: the image file's size)",
    coordinate='<bndbox> holds <xmin>, <ymin>, <xmax> and <ymax>, pixel '
    'numbers written with a decimal point (e.g. 125 or 125.5), the first '
    'pixel numbered {base} (bbox_base={base})')
BOX_KEYS = ('xmin', 'ymin', 'xmax', 'ymax')
SIZE_DEFAULT = "the image file's size"


def voc_size(doc: XMLFields, tally: AnnotationTally) -> Optional[
        Tuple[int, int]]:
    """``(width, height)`` from ``<size>``, or None when the file states
    none (missing, empty or 0: counted as the ``<size>`` default)."""
    size = doc.root.find('size')
    values = []
    for key in ('width', 'height'):
        node = None if size is None else size.find(key)
        text = '' if node is None else (node.text or '').strip()
        if not text:
            tally.default_applied('<size>', doc.path, SIZE_DEFAULT)
            return None
        try:
            value = float(text)
        except ValueError:
            value = float('nan')
        if not (value >= 0 and value == int(value)):
            raise doc.error(f'<{key}>', doc.line(node),
                            f'is {text!r}, not a whole number of pixels',
                            FIELD_CONVENTIONS['size'])
        values.append(int(value))
    if min(values) == 0:
        tally.default_applied('<size>', doc.path, SIZE_DEFAULT)
        return None
    return values[0], values[1]


def voc_box(doc: XMLFields, obj, base: int) -> List[float]:
    """``[x1, y1, x2, y2]`` of an ``<object>``'s ``<bndbox>``, each value
    minus ``base``."""
    convention = FIELD_CONVENTIONS['coordinate'].format(base=base)
    box = obj.find('bndbox')
    if box is None:
        raise doc.error('<object>', doc.line(obj), 'has no <bndbox>',
                        convention)
    return [doc.number(box, key, convention) - base for key in BOX_KEYS]


def voc_objects(doc: XMLFields, base: int, names: ClassNames,
                tally: AnnotationTally) -> List[dict]:
    """The objects of known names: ``name`` (the known name, aliases
    resolved), ``bbox`` (minus ``base``) and ``difficult``; unknown names
    are counted in ``tally``."""
    objects = []
    for obj in doc.root.findall('object'):
        name = tally.read_name(
            names, doc.text(obj, 'name', FIELD_CONVENTIONS['name']),
            doc.path)
        if name is None:
            continue
        difficult = doc.optional_int(
            obj, 'difficult', (0, 1), 0, FIELD_CONVENTIONS['difficult'],
            lambda tag: tally.default_applied(f'<{tag}>', doc.path,
                                              '0 (not difficult)'))
        objects.append(dict(name=name, bbox=voc_box(doc, obj, base),
                            difficult=difficult))
    return objects

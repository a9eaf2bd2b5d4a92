"""The frame a VOC xml's boxes are given in: the coordinate base of the
release and the image size the annotation states.

VOC xml files write pixel coordinates as numbers, but releases differ in
where they count from: PASCAL VOC's own files number the first pixel 1, so
MMDetection subtracts 1; files written by a converter from 0-based
coordinates (the aligned FLIR release) do not want that. A dataset names
the base of its release (``BBOX_BASE``, overridable with ``bbox_base``) and
every coordinate is loaded as ``value - base``, so a box spanning the whole
image ends at ``width - 1``, the last pixel's index, whichever the base.
"""
import io
import xml.etree.ElementTree as ET
from typing import List, Optional, Tuple

from mmsafe.errors import MMSafeValueError

#: the coordinate bases a release may count from
BBOX_BASES = (0, 1)


def check_bbox_base(base: int, owner: str) -> int:
    """``base`` if it is one of :data:`BBOX_BASES`, else a ValueError.

    Args:
        base (int): the coordinate base asked for.
        owner (str): who asks, for the message (the dataset class).
    """
    if isinstance(base, bool) or base not in BBOX_BASES:
        raise MMSafeValueError(
            f'{owner}: bbox_base={base!r}; it must be 1 (the xml numbers '
            'the first pixel 1, as PASCAL VOC does: 1 is subtracted) or 0 '
            '(the xml counts from 0: the values are used as they are)')
    return int(base)


def voc_box(bndbox: Optional[ET.Element], base: int,
            where: str) -> List[float]:
    """``[x1, y1, x2, y2]`` of a ``<bndbox>``, each value minus ``base``.

    Args:
        bndbox (Element, optional): the object's ``<bndbox>`` element.
        base (int): the release's coordinate base.
        where (str): the xml file, for the message of a missing value.
    """
    if bndbox is None:
        raise MMSafeValueError(f'{where}: an <object> has no <bndbox>')
    values = []
    for key in ('xmin', 'ymin', 'xmax', 'ymax'):
        node = bndbox.find(key)
        if node is None or not (node.text or '').strip():
            raise MMSafeValueError(
                f'{where}: a <bndbox> has no <{key}>; the VOC '
                'reader needs xmin, ymin, xmax and ymax')
        values.append(float(node.text) - base)
    return values


def xml_size(root: ET.Element) -> Optional[Tuple[int, int]]:
    """``(width, height)`` from the xml's ``<size>``, or None when it has
    none or states a zero or negative size (some tools write ``0``)."""
    size = root.find('size')
    if size is None:
        return None
    try:
        width = int(float(size.find('width').text))
        height = int(float(size.find('height').text))
    except (AttributeError, TypeError, ValueError):
        return None
    if width <= 0 or height <= 0:
        return None
    return width, height


def image_size(data: bytes, where: str) -> Tuple[int, int]:
    """``(width, height)`` of an encoded image as the loader decodes it
    (EXIF rotations applied), reading the header only where it can.

    Args:
        data (bytes): the file's bytes.
        where (str): the file, for the message when it cannot be decoded.
    """
    from PIL import Image
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            orientation = img.getexif().get(0x0112, 1)
        if orientation in (5, 6, 7, 8):  # the loader applies the rotation
            width, height = height, width
        return width, height
    except Exception as pil_error:  # noqa: BLE001 - decoded below instead
        import mmcv
        img = mmcv.imfrombytes(data)
        if img is None:
            raise MMSafeValueError(
                f'{where}: the annotation states no image size and the '
                f'image cannot be decoded ({pil_error})') from pil_error
        return img.shape[1], img.shape[0]

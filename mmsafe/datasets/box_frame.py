"""The frame a VOC xml's boxes are given in: the coordinate base of the
release and the image size the annotation states.

VOC xml files write pixel coordinates as numbers, but releases differ in
where they count from: PASCAL VOC's own files number the first pixel 1, so
MMDetection subtracts 1; files written by a converter from 0-based
coordinates (the aligned FLIR release) do not want that. A dataset names
the base of its release (``BBOX_BASE``, overridable with ``bbox_base``) and
every coordinate is loaded as ``value - base``
(:func:`~mmsafe.datasets.voc_annotations.voc_box`), so a box spanning the
whole image ends at ``width - 1``, the last pixel's index, whichever the
base. An xml that states no size
(:func:`~mmsafe.datasets.voc_annotations.voc_size`) takes the image
file's (:func:`image_size`).
"""
import io
from typing import Tuple

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

"""M3FD (TarDAL's multi-scenario multi-modality detection set)."""
from typing import Dict, Optional

from mmsafe.registry import DATASETS
from .llvip import LLVIPDataset

M3FD_PREFIX = dict(img='Vis/', ir_img='Ir/', ann='Annotation/')

#: M3FD's classes in the order of TarDAL (``loader/m3fd.py``), the
#: reference code by the dataset's authors: label ``i`` is
#: ``M3FD_CLASSES[i]``, as in TarDAL's label files and detectors. The xml
#: files name the class, so the order only fixes the label numbers; a
#: model trained with another order keeps it with
#: ``metainfo=dict(classes=(...))`` on the dataset.
M3FD_CLASSES = ('People', 'Car', 'Bus', 'Lamp', 'Motorcycle', 'Truck')


@DATASETS.register_module()
class M3FDDataset(LLVIPDataset):
    """M3FD_Detection in its released layout::

        data_root/
          Vis/{stem}.png          visible
          Ir/{stem}.png           infrared, same stem and size
          Annotation/{stem}.xml   VOC xml with <size> (People, Car, Bus,
                                  Lamp, Motorcycle, Truck)

    4,200 pairs numbered ``00000``-``04199``, no official split: give
    ``ann_file`` (one stem per line, e.g. ``ImageSets/train.txt``, made by
    ``tools/make_m3fd_split.py``), or leave it empty for every image of
    ``Vis/``. Classes and label numbers: :data:`M3FD_CLASSES` (TarDAL's
    order). Pairing, missing partners, VOC parsing and filtering are those
    of :class:`LLVIPDataset`.

    Image sizes are per image, from each xml's ``<size>``: 3,926 pairs are
    1024x768 and 274 are smaller (880x520, 800x480, 780x420, 740x400,
    480x360, 440x320, 440x280, 400x280; frames ``01301``-``01334``,
    ``01494``-``01529``, ``01797``-``01844``, ``01912``-``01934``,
    ``02625``-``02708``, ``02890``-``02938``). Rule: the xml's size is the
    frame of its boxes; an xml without a size (or with a zero one) takes
    the visible image's; a size that differs from the image file is kept
    as annotated and named by ``tools/check_dataset.py``
    (``annotation_size_mismatch``), and the loaded image decides the
    pipeline's shapes.

    Checked on the boxes of all 4,200 annotations (34,407 boxes), read back
    exactly from the COCO files that the public repository
    ``ganlumomo/voc2coco`` converted from the release's xml
    (``outputs/m3fd-{train,val,test}.json``; ``xmin = x + 1``, ``xmax = x
    + w``): the sizes above are those of the xml, and on the 274 smaller
    frames 36 boxes end exactly at their own width and 22 at their own
    height, none beyond, so the boxes are in each frame's own size.
    Coordinate base: ``xmin`` is 1 on 940 boxes and 0 on none, ``ymin`` 1
    on 34 and 0 on none, ``xmax`` equals the width on 1,207 and ``ymax``
    the height on 1,049, none beyond: PASCAL VOC's 1-based numbering
    (``BBOX_BASE = 1``; loaded 0 to width - 1). labelImg's files (0-based,
    minimum raised to 1) look the same and no M3FD images were at hand to
    tell them apart, so the format's convention stays.

    Args:
        data_prefix (dict): folders relative to ``data_root``. Defaults to
            ``dict(img='Vis/', ir_img='Ir/', ann='Annotation/')``.
        img_suffix (str): suffix of stems read from ``ann_file``. Defaults
            to ``'.png'``.
        **kwargs: :class:`LLVIPDataset` arguments (``bbox_base``, ...).
    """

    METAINFO = dict(
        classes=M3FD_CLASSES,
        palette=[(220, 20, 60), (0, 0, 142), (0, 60, 100), (250, 170, 30),
                 (0, 0, 230), (0, 0, 70)])
    #: the release's xml files number the first pixel 1 (see the docstring)
    BBOX_BASE = 1
    #: how the release writes its annotation files, for messages
    ANNOTATION_FORMAT = "M3FD's xml (PASCAL VOC format)"

    def __init__(self, *args, data_prefix: Optional[Dict[str, str]] = None,
                 img_suffix: str = '.png', **kwargs) -> None:
        prefix = dict(M3FD_PREFIX, **(data_prefix or {}))
        super().__init__(*args, data_prefix=prefix, img_suffix=img_suffix,
                         **kwargs)


__all__ = ['M3FDDataset', 'M3FD_CLASSES']

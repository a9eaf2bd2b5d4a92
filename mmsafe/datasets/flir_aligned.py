"""FLIR ADAS, the aligned visible/thermal pairs (Zhang et al., 2020)."""
import os.path as osp
import re
from typing import Dict, List, Optional, Tuple

from mmengine.fileio import exists, list_dir_or_file, list_from_file

from mmsafe.registry import DATASETS
from mmsafe.errors import MMSafeFileNotFoundError
from .llvip import LLVIPDataset

FLIR_PREFIX = dict(img='JPEGImages/', ir_img='JPEGImages/',
                   ann='Annotations/')
# FLIR_00002, FLIR_00002_PreviewData, FLIR_00002_RGB.jpg -> FLIR_00002
_SUFFIX = re.compile(r'(_PreviewData|_RGB)?(\.jpe?g|\.xml)?$', re.IGNORECASE)


def frame_id(line: str) -> str:
    """The frame id (``FLIR_00002``) of a list line or file name."""
    return _SUFFIX.sub('', osp.basename(line.strip()))


@DATASETS.register_module()
class FLIRAlignedDataset(LLVIPDataset):
    """The aligned FLIR ADAS release in its layout::

        data_root/
          JPEGImages/FLIR_{n}_RGB.jpg          visible, aligned to thermal
          JPEGImages/FLIR_{n}_PreviewData.jpeg thermal (infrared)
          Annotations/FLIR_{n}_PreviewData.xml VOC xml (person, car,
                                               bicycle; others dropped,
                                               counted by name)
          align_train.txt                      4,129 frames
          align_validation.txt                 1,013 frames

    List lines may name the frame as ``FLIR_00002``,
    ``FLIR_00002_PreviewData`` or ``FLIR_00002_RGB``. Without ``ann_file``
    every ``*_RGB.jpg`` of the image folder is used. Pairing, missing
    partners, VOC parsing and filtering are those of :class:`LLVIPDataset`.

    The xml files count from 0 (``BBOX_BASE = 0``): the values are loaded
    as they are, unlike PASCAL VOC's. Checked on the boxes of 5,141 frames
    of the release (4,128 of the 4,129 train frames, all 1,013 validation
    ones; 40,765 boxes, every frame 640x512), read back exactly from the
    COCO files that the public repository ``ganlumomo/voc2coco`` converted
    from the release's ``Annotations/*.xml``
    (``flir_aligned_split/thermal_*``, ``outputs/thermal-val-coco.json``;
    its converter writes ``x = xmin - 1``, ``w = xmax - x``, so ``xmin = x
    + 1`` and ``xmax = x + w``):
    ``xmin`` is 0 on 1,363 boxes and 1 on 301, ``xmax`` is 639 on 1,034,
    640 on none (641 on one box), ``ymax`` 511 on 13 and never 512. Both
    image borders are reached at 0 and at width - 1: 0-based pixel
    indices. Read 1-based (VOC's minus one), those 1,363 boxes would start
    at x = -1 and no box would reach the right border.

    Args:
        data_prefix (dict): folders relative to ``data_root``. Defaults to
            ``dict(img='JPEGImages/', ir_img='JPEGImages/',
            ann='Annotations/')``.
        visible_suffix (str): ``'_RGB.jpg'``.
        infrared_suffix (str): ``'_PreviewData.jpeg'``.
        ann_suffix (str): ``'_PreviewData.xml'``.
        **kwargs: :class:`LLVIPDataset` arguments.
    """

    METAINFO = dict(
        classes=('person', 'car', 'bicycle'),
        palette=[(220, 20, 60), (0, 0, 142), (119, 11, 32)])
    #: the release's xml files count from 0 (see the docstring)
    BBOX_BASE = 0
    #: how the release writes its annotation files, for messages
    ANNOTATION_FORMAT = "the aligned FLIR release's xml (PASCAL VOC format)"

    def __init__(self, *args, data_prefix: Optional[Dict[str, str]] = None,
                 visible_suffix: str = '_RGB.jpg',
                 infrared_suffix: str = '_PreviewData.jpeg',
                 ann_suffix: str = '_PreviewData.xml', **kwargs) -> None:
        self.visible_suffix = visible_suffix
        self.infrared_suffix = infrared_suffix
        self.ann_suffix = ann_suffix
        prefix = dict(FLIR_PREFIX, **(data_prefix or {}))
        super().__init__(*args, data_prefix=prefix, **kwargs)

    def _image_names(self) -> List[str]:
        """Visible file names, from the align list or the image folder."""
        if self.ann_file:
            return [
                frame_id(line) + self.visible_suffix
                for line in list_from_file(
                    self.ann_file, backend_args=self.backend_args)
                if line.strip()
            ]
        img_dir = self.data_prefix['img']
        if not exists(img_dir, backend_args=self.backend_args):
            raise MMSafeFileNotFoundError(
                f'FLIRAlignedDataset: image folder {img_dir} does not exist '
                f'(data_root={self.data_root!r})')
        return sorted(
            name for name in list_dir_or_file(
                img_dir, list_dir=False, recursive=False,
                backend_args=self.backend_args)
            if name.endswith(self.visible_suffix))

    def pair_paths(self, name: str) -> Tuple[str, str, str, str]:
        """``(frame id, visible, thermal, xml)`` of ``FLIR_{n}_RGB.jpg``."""
        frame = frame_id(name)
        return (frame, osp.join(self.data_prefix['img'], name),
                osp.join(self.data_prefix['ir_img'],
                         frame + self.infrared_suffix),
                osp.join(self.data_prefix['ann'], frame + self.ann_suffix))

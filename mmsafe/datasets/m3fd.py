"""M3FD (TarDAL's multi-scenario multi-modality detection set)."""
from typing import Dict, Optional

from mmdet.registry import DATASETS
from .llvip import LLVIPDataset

M3FD_PREFIX = dict(img='Vis/', ir_img='Ir/', ann='Annotation/')


@DATASETS.register_module()
class M3FDDataset(LLVIPDataset):
    """M3FD_Detection in its released layout::

        data_root/
          Vis/{stem}.png          visible, 1024x768
          Ir/{stem}.png           infrared, same stem
          Annotation/{stem}.xml   VOC xml (People, Car, Bus, Motorcycle,
                                  Lamp, Truck)

    4,200 pairs, no official split: give ``ann_file`` (one stem per line,
    e.g. ``ImageSets/train.txt``) for a split, or leave it empty for every
    image of ``Vis/``. Pairing, missing partners, VOC parsing and filtering
    are those of :class:`LLVIPDataset`.

    Args:
        data_prefix (dict): folders relative to ``data_root``. Defaults to
            ``dict(img='Vis/', ir_img='Ir/', ann='Annotation/')``.
        img_suffix (str): suffix of stems read from ``ann_file``. Defaults
            to ``'.png'``.
        **kwargs: :class:`LLVIPDataset` arguments.
    """

    METAINFO = dict(
        classes=('People', 'Car', 'Bus', 'Motorcycle', 'Lamp', 'Truck'),
        palette=[(220, 20, 60), (0, 0, 142), (0, 60, 100), (0, 0, 230),
                 (250, 170, 30), (0, 0, 70)])

    def __init__(self, *args, data_prefix: Optional[Dict[str, str]] = None,
                 img_suffix: str = '.png', **kwargs) -> None:
        prefix = dict(M3FD_PREFIX, **(data_prefix or {}))
        super().__init__(*args, data_prefix=prefix, img_suffix=img_suffix,
                         **kwargs)

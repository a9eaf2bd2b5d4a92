"""KAIST multispectral pedestrians: visible + LWIR frames with per-frame
text annotations in Piotr Dollar's bbGt format."""
import logging
import os.path as osp
import re
from typing import Dict, List, Optional, Sequence, Tuple

import mmcv
from mmengine.fileio import exists, get, get_text, list_from_file

from mmdet.datasets import BaseDetDataset
from mmdet.registry import DATASETS
from mmsafe.events import log
from .transforms.compose import assert_paired_pipeline, paired_pipeline
from .pairing import (MissingPair, check_missing_pair_policy,
                      handle_missing_pairs, missing_side,
                      raise_missing_annotations)

KAIST_PREFIX = dict(img='images/', ann='annotations/')
_FRAME = re.compile(r'(set\d+)[/_\\](V\d+)[/_\\](?:visible[/_\\]|lwir[/_\\])?'
                    r'(I\d+)')


def parse_frame(line: str) -> Tuple[str, str, str]:
    """``('set00', 'V000', 'I01225')`` from a list line such as
    ``set00/V000/I01225`` or ``set00_V000_I01225``."""
    match = _FRAME.search(line.strip())
    if match is None:
        raise ValueError(f'KAISTDataset: cannot read a frame '
                         f'(setNN/VNNN/INNNNN) from the list line {line!r}')
    return match.group(1), match.group(2), match.group(3)


def parse_bbgt(text: str, source: str = '') -> List[dict]:
    """Objects of a bbGt text annotation.

    Each line after the ``% bbGt version=3`` header is
    ``label x y w h occ vx vy vw vh ign ang`` (the last eight optional),
    ``x y w h`` in pixels from the top-left corner.

    Returns:
        list[dict]: ``label``, ``bbox`` (xyxy), ``occlusion``, ``ignore``.
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
            raise ValueError(
                f'KAISTDataset: {source}:{num}: expected "label x y w h '
                f'[occ vx vy vw vh ign ang]", got {line!r}') from err
        objects.append(dict(label=parts[0], bbox=[x, y, x + w, y + h],
                            occlusion=occ, ignore=ign))
    return objects


@DATASETS.register_module()
class KAISTDataset(BaseDetDataset):
    """KAIST multispectral pedestrian benchmark in its released layout::

        data_root/
          images/set{00-11}/V{000}/visible/I{00000}.jpg   640x512 colour
          images/set{00-11}/V{000}/lwir/I{00000}.jpg      aligned thermal
          annotations/set{00-11}/V{000}/I{00000}.txt      bbGt text
          imageSets/train-all-02.txt, test-all-20.txt     'set00/V000/I01225'

    Annotations are Dollar's bbGt text (``% bbGt version=3``, then
    ``person x y w h occ vx vy vw vh ign ang`` per object): the format of the
    original release and of the widely used sanitized training and improved
    test annotations. Those are often shipped flat
    (``set00_V000_I01225.txt``): set ``ann_name='{set}_{video}_{frame}.txt'``
    and ``data_prefix['ann']`` to their folder.

    Only ``person`` boxes are trained on and evaluated. ``people``,
    ``cyclist``, ``person?`` and every box flagged ``ign``, lower than
    ``min_height`` or more occluded than ``max_occlusion`` become ignore
    regions (``ignore_flag=1``): KAIST's "reasonable" setting is
    ``min_height=55, max_occlusion=1`` (no or partial occlusion).

    Args:
        ann_file (str): the image list (required), relative to data_root.
        data_prefix (dict): ``img`` (the ``images`` folder) and ``ann``.
        ann_name (str): annotation file of a frame, formatted with ``set``,
            ``video``, ``frame``. Defaults to ``'{set}/{video}/{frame}.txt'``.
        visible_dir (str), infrared_dir (str): modality folders inside a
            video folder. Default ``'visible'`` and ``'lwir'``.
        img_suffix (str): ``'.jpg'``.
        min_height (float): persons lower than this (pixels) are ignored.
        max_occlusion (int): persons with a larger occlusion level (0 none,
            1 partial, 2 heavy) are ignored.
        img_shape (tuple, optional): ``(height, width)`` of every frame
            (KAIST: 512x640). None reads each visible image's size.
        on_missing_pair (str): ``'error'`` (default) or ``'skip'``.
        **kwargs: :class:`mmdet.datasets.BaseDetDataset` arguments.
    """

    METAINFO = dict(classes=('person', ), palette=[(220, 20, 60)])

    def __init__(self,
                 *args,
                 data_prefix: Optional[Dict[str, str]] = None,
                 ann_name: str = '{set}/{video}/{frame}.txt',
                 visible_dir: str = 'visible',
                 infrared_dir: str = 'lwir',
                 img_suffix: str = '.jpg',
                 min_height: float = 0.0,
                 max_occlusion: int = 2,
                 img_shape: Optional[Sequence[int]] = (512, 640),
                 on_missing_pair: str = 'error',
                 **kwargs) -> None:
        self.ann_name = ann_name
        self.visible_dir = visible_dir
        self.infrared_dir = infrared_dir
        self.img_suffix = img_suffix
        self.min_height = min_height
        self.max_occlusion = max_occlusion
        self.img_shape = tuple(img_shape) if img_shape else None
        self.on_missing_pair = check_missing_pair_policy(on_missing_pair)
        prefix = dict(KAIST_PREFIX, **(data_prefix or {}))
        owner = f'KAISTDataset({kwargs.get("ann_file", "")})'
        # before the annotations are read: a broken pipeline fails fast
        assert_paired_pipeline(kwargs.get('pipeline') or [], owner)
        super().__init__(*args, data_prefix=prefix, **kwargs)
        # each sample's steps are watched (PairedCompose)
        self.pipeline = paired_pipeline(self.pipeline, owner)

    def load_data_list(self) -> List[dict]:
        """One data info per listed frame, with its LWIR partner."""
        owner = f'KAISTDataset({self.ann_file})'
        if not self.ann_file:
            raise ValueError(f'{owner}: ann_file (the image list, e.g. '
                             'imageSets/train-all-02.txt) is required')
        frames = [
            parse_frame(line) for line in list_from_file(
                self.ann_file, backend_args=self.backend_args)
            if line.strip()
        ]
        if not frames:
            raise FileNotFoundError(f'{owner}: the image list is empty')
        missing: List[MissingPair] = []
        missing_ann: List[str] = []
        entries = []
        for set_id, video, frame in frames:
            folder = osp.join(self.data_prefix['img'], set_id, video)
            vis = osp.join(folder, self.visible_dir, frame + self.img_suffix)
            ir = osp.join(folder, self.infrared_dir, frame + self.img_suffix)
            ann = osp.join(self.data_prefix['ann'], self.ann_name.format(
                set=set_id, video=video, frame=frame))
            has_vis = exists(vis, backend_args=self.backend_args)
            has_ir = exists(ir, backend_args=self.backend_args)
            if not (has_vis and has_ir):
                missing.append((vis, ir, missing_side(has_vis, has_ir)))
                continue
            if not exists(ann, backend_args=self.backend_args):
                missing_ann.append(ann)
                continue
            entries.append((f'{set_id}/{video}/{frame}', vis, ir, ann))
        raise_missing_annotations(
            owner, missing_ann, len(frames),
            f'frames have no annotation file (ann_name={self.ann_name!r})')
        handle_missing_pairs(owner, missing, len(frames),
                             self.on_missing_pair)
        data_list = [self.parse_data_info(dict(
            img_id=img_id, img_path=vis, ir_img_path=ir, ann_path=ann))
            for img_id, vis, ir, ann in entries]
        ignored = sum(i['ignore_flag'] for d in data_list
                      for i in d['instances'])
        if ignored:
            log(f'{owner}: {ignored} boxes are ignore regions (not person, '
                f'flagged, lower than {self.min_height} px or occlusion > '
                f'{self.max_occlusion})', logging.INFO)
        return data_list

    def parse_data_info(self, raw: dict) -> dict:
        """Parse one frame's annotation into a data info."""
        objects = parse_bbgt(
            get_text(raw['ann_path'], backend_args=self.backend_args),
            raw['ann_path'])
        if self.img_shape is not None:
            height, width = self.img_shape
        else:
            img = mmcv.imfrombytes(
                get(raw['img_path'], backend_args=self.backend_args))
            height, width = img.shape[:2]
        instances = []
        for obj in objects:
            x1, y1, x2, y2 = obj['bbox']
            valid = (obj['label'] == 'person' and not obj['ignore']
                     and y2 - y1 >= self.min_height
                     and obj['occlusion'] <= self.max_occlusion
                     and x2 > x1 and y2 > y1)
            instances.append(dict(bbox=obj['bbox'], bbox_label=0,
                                  ignore_flag=0 if valid else 1))
        return dict(img_id=raw['img_id'], img_path=raw['img_path'],
                    ir_img_path=raw['ir_img_path'], height=height,
                    width=width, instances=instances)

    def filter_data(self) -> List[dict]:
        """Drop frames without a valid person when
        ``filter_cfg=dict(filter_empty_gt=True)`` (training only)."""
        if self.test_mode or not self.filter_cfg:
            return self.data_list
        if not self.filter_cfg.get('filter_empty_gt', False):
            return self.data_list
        return [d for d in self.data_list
                if any(i['ignore_flag'] == 0 for i in d['instances'])]

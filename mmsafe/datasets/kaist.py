"""KAIST multispectral pedestrians: visible + LWIR frames with any of the
benchmark's annotation releases (see :mod:`.kaist_annotations`)."""
import logging
import os.path as osp
import re
from typing import Dict, List, Optional, Sequence, Tuple

import mmcv
from mmengine.fileio import exists, get, list_from_file

from mmdet.datasets import BaseDetDataset
from mmsafe.registry import DATASETS, builds_in_mmsafe_scope
from mmsafe.errors import MMSafeFileNotFoundError, MMSafeValueError
from mmsafe.events import log
from .annotation_reader import MalformedAnnotationError
from .annotation_tally import (AnnotationTally, ClassNames,
                               check_malformed_policy, handle_malformed)
from .kaist_annotations import (ANN_FOLDERS, DEFAULTS, KAIST_LABELS,
                                LAYOUTS, layout_files, pair_objects,
                                parse_bbgt, parse_kaist_xml)
from .pairing import (MissingPair, check_missing_pair_policy,
                      handle_missing_pairs, missing_side,
                      raise_missing_annotations)
from .transforms.compose import assert_paired_pipeline, paired_pipeline

KAIST_PREFIX = dict(img='images/')
ANN_LAYOUTS = ('auto', ) + tuple(LAYOUTS)
PAIRED_BOXES = ('visible', 'infrared')
#: listed frames probed when the annotation layout is detected
NUM_PROBED = 20
_FRAME = re.compile(r'(set\d+)[/_\\](V\d+)[/_\\](?:visible[/_\\]|lwir[/_\\])?'
                    r'(I\d+)')


def parse_frame(line: str) -> Tuple[str, str, str]:
    """``('set00', 'V000', 'I01225')`` from a list line such as
    ``set00/V000/I01225`` or ``set00_V000_I01225`` (CRLF endings too)."""
    match = _FRAME.search(line.strip())
    if match is None:
        raise MMSafeValueError(
            f'KAISTDataset: cannot read a frame '
            f'(setNN/VNNN/INNNNN) from the list line {line!r}')
    return match.group(1), match.group(2), match.group(3)


def _centre(box: Sequence[float]) -> Tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


@DATASETS.register_module()
class KAISTDataset(BaseDetDataset):
    """KAIST multispectral pedestrian benchmark in its released layout::

        data_root/
          images/set{00-11}/V{000}/visible/I{00000}.jpg   640x512 colour
          images/set{00-11}/V{000}/lwir/I{00000}.jpg      aligned thermal
          <annotations>                                    any release below
          imageSets/train-all-02.txt, test-all-20.txt     'set00/V000/I01225'

    The annotation release is found by itself (``ann_layout='auto'``):
    in ``data_prefix['ann']``, or, when that is not given, in
    ``annotations/``, ``annotations-xml-new/`` then ``annotations_paired/``,
    the first listed frames are looked up as

    - ``setNN/VNNN/{visible,lwir}/INNNNN.txt``: AR-CNN's KAIST-Paired, one
      bbGt file per modality (``'paired'``);
    - ``setNN/VNNN/INNNNN.txt``: the original bbGt text (``'bbgt'``);
    - ``setNN_VNNN_INNNNN.txt``: flat bbGt text, as the sanitized training
      and the improved test annotations ship (``'flat'``);
    - ``setNN/VNNN/INNNNN.xml``: kaist-cvpr15's ``annotations-xml-new``
      (``'xml'``).

    The first match is used (the others found are logged); none is an
    error that lists every path looked for. ``ann_layout`` names one layout
    instead, ``ann_name`` any other file name.

    Each instance keeps the raw annotation the benchmark's evaluation needs
    (``KAISTMissRate`` applies the official settings to it): ``label_name``,
    ``occlusion`` (0 none, 1 partial, 2 heavy) and ``ign`` (the bbGt
    ignore flag). ``bbox`` is ``[x, y, x + w, y + h]`` of the file's
    ``x y w h``. With KAIST-Paired, ``vis_bbox`` and ``ir_bbox`` hold both
    modalities' boxes, ``bbox`` is the one ``paired_box`` names, and
    ``ir_offset`` is the infrared box centre minus the visible one
    (``[dx, dy]`` pixels: the pair's disparity for that person).

    Only ``person`` is trained on. Other labels (``people``, ``cyclist``,
    ``person?``...), boxes flagged ``ign``, lower than ``min_height`` or
    more occluded than ``max_occlusion`` are ignore regions
    (``ignore_flag=1``). A label the releases do not use
    (:data:`~.kaist_annotations.KAIST_LABELS`; ``Person``, ``ped``) is
    kept as an ignore region too, and counted by name in the load log,
    with the label it matches when only case or spacing differs;
    ``class_aliases=dict(Person='person')`` reads it as that label.

    Every field is read with its release's convention: a malformed one
    (an empty ``<name/>``, ``12,5``, ``nan``, an occlusion of 7, bytes
    that are not UTF-8 ...) is an error naming the file, the element or
    field and its line; all malformed files of the list are named
    together. A missing ``<occlusion>``/``<difficult>`` (or a bbGt line
    without its occlusion and ignore fields) reads 0, counted
    (``annotation_tally``).

    Verified on real files: the kaist-cvpr15 ``annotations-xml-new``
    (95,324 files, 109,629 boxes) with its CRLF ``imageSets``, and the
    improved test annotations (2,252 flat files, 4,254 boxes, identical to
    the xml release on those frames). KAIST-Paired follows the paths its
    author gives, a file of it quoted in AR-CNN's issue tracker and the
    readers published with it; the sanitized training annotations share
    the improved ones' reader (neither release could be fetched); see
    docs/user_guides/datasets.md.

    Args:
        ann_file (str): the image list (required), relative to data_root.
        data_prefix (dict): ``img`` (the ``images`` folder, default
            ``'images/'``) and optionally ``ann`` (the annotation folder).
        ann_layout (str): ``'auto'`` (default), ``'bbgt'``, ``'flat'``,
            ``'xml'`` or ``'paired'``.
        ann_name (str, optional): the annotation file of a frame, formatted
            with ``set``, ``video``, ``frame`` (and ``modality``,
            ``visible``/``lwir``, for ``ann_layout='paired'``); read as xml
            when it ends in ``.xml``, else as bbGt text. Defaults to the
            layout's.
        paired_box (str): with KAIST-Paired, the modality whose box is
            ``bbox`` (trained on and evaluated): ``'visible'`` (default) or
            ``'infrared'``.
        visible_dir (str), infrared_dir (str): modality folders inside a
            video folder. Default ``'visible'`` and ``'lwir'``.
        img_suffix (str): ``'.jpg'``.
        min_height (float): persons lower than this (pixels) are ignored.
        max_occlusion (int): persons with a larger occlusion level are
            ignored.
        img_shape (tuple, optional): ``(height, width)`` of every frame
            (KAIST: 512x640). None reads each visible image's size.
        on_missing_pair (str): ``'error'`` (default) or ``'skip'``.
        require_images (bool): check that both images of every frame exist
            (default True). False reads the annotations alone (scoring
            detection files: tools/eval_kaist.py).
        class_aliases (dict, optional): labels in the files read as one of
            the releases' labels, e.g. ``dict(Person='person')``.
        on_malformed_annotation (str): ``'error'`` (default): malformed
            annotation files stop the build, all named; ``'skip'``: their
            frames are left out, counted and logged.
        **kwargs: :class:`mmdet.datasets.BaseDetDataset` arguments.
    """

    METAINFO = dict(classes=('person', ), palette=[(220, 20, 60)])

    @builds_in_mmsafe_scope
    def __init__(self,
                 *args,
                 data_prefix: Optional[Dict[str, str]] = None,
                 ann_layout: str = 'auto',
                 ann_name: Optional[str] = None,
                 paired_box: str = 'visible',
                 visible_dir: str = 'visible',
                 infrared_dir: str = 'lwir',
                 img_suffix: str = '.jpg',
                 min_height: float = 0.0,
                 max_occlusion: int = 2,
                 img_shape: Optional[Sequence[int]] = (512, 640),
                 on_missing_pair: str = 'error',
                 require_images: bool = True,
                 class_aliases: Optional[Dict[str, str]] = None,
                 on_malformed_annotation: str = 'error',
                 **kwargs) -> None:
        if ann_layout not in ANN_LAYOUTS:
            raise MMSafeValueError(f'KAISTDataset: ann_layout={ann_layout!r}; '
                                   f'choose one of {ANN_LAYOUTS}')
        if ann_name is not None and ann_layout == 'auto':
            ann_layout = ('paired' if '{modality}' in ann_name else
                          'xml' if ann_name.endswith('.xml') else 'bbgt')
        if paired_box not in PAIRED_BOXES:
            raise MMSafeValueError(f'KAISTDataset: paired_box={paired_box!r}; '
                                   f'choose one of {PAIRED_BOXES}')
        self.ann_layout = ann_layout
        self.ann_name = ann_name
        self.paired_box = paired_box
        self.visible_dir = visible_dir
        self.infrared_dir = infrared_dir
        self.img_suffix = img_suffix
        self.min_height = min_height
        self.max_occlusion = max_occlusion
        self.img_shape = tuple(img_shape) if img_shape else None
        self.on_missing_pair = check_missing_pair_policy(on_missing_pair)
        self.require_images = require_images
        self.class_aliases = dict(class_aliases or {})
        self.on_malformed_annotation = check_malformed_policy(
            on_malformed_annotation)
        prefix = dict(KAIST_PREFIX, **(data_prefix or {}))
        owner = f'KAISTDataset({kwargs.get("ann_file", "")})'
        # before the annotations are read: a broken pipeline fails fast
        assert_paired_pipeline(kwargs.get('pipeline') or [], owner)
        super().__init__(*args, data_prefix=prefix, **kwargs)
        # each sample's steps are watched (PairedCompose)
        self.pipeline = paired_pipeline(self.pipeline, owner)

    # ------------------------------------------------------------ layout
    def _candidates(self) -> List[Tuple[str, str, str]]:
        """(folder, layout, template) pairs to try, in order."""
        if 'ann' in self.data_prefix:
            folders = [self.data_prefix['ann']]
        else:
            folders = [osp.join(self.data_root or '', f) for f in ANN_FOLDERS]
        if self.ann_layout == 'auto':
            layouts = ['paired', 'bbgt', 'flat', 'xml']
        else:
            layouts = [self.ann_layout]
        return [(folder, layout, self.ann_name or LAYOUTS[layout][0])
                for folder in folders for layout in layouts]

    def _find_layout(self, owner: str,
                     frames: List[Tuple[str, str, str]]) -> Tuple[str, ...]:
        """The (folder, layout, template) whose files the first listed
        frames have."""
        probed = frames[:NUM_PROBED]
        found, looked = [], []
        for folder, layout, template in self._candidates():
            for i, frame in enumerate(probed):
                paths = layout_files(layout, template, folder, *frame)
                if i == 0:
                    looked.append(' + '.join(paths))
                if all(exists(p, backend_args=self.backend_args)
                       for p in paths):
                    found.append((folder, layout, template))
                    break
        if not found:
            raise MMSafeFileNotFoundError(
                f'{owner}: no annotation file for the first '
                f'{len(probed)} listed frames (from {"/".join(frames[0])}).'
                ' Looked for: ' + '; '.join(looked) + '. Set '
                "data_prefix=dict(ann='<annotation folder>/') and, if "
                'needed, ann_layout (one of '
                f'{ANN_LAYOUTS[1:]}) or ann_name.')
        if len(found) > 1:
            log(f'{owner}: annotations read from {found[0][0]} '
                f'({LAYOUTS[found[0][1]][1]}); also present: '
                + ', '.join(f'{f} ({LAYOUTS[lay][1]})'
                            for f, lay, _ in found[1:]) +
                "; set data_prefix['ann'] / ann_layout to choose",
                logging.WARNING)
        return found[0]

    # -------------------------------------------------------------- list
    def load_data_list(self) -> List[dict]:
        """One data info per listed frame, with its LWIR partner."""
        owner = f'KAISTDataset({self.ann_file})'
        if not self.ann_file:
            raise MMSafeValueError(f'{owner}: ann_file (the image list, e.g. '
                                   'imageSets/train-all-02.txt) is required')
        frames = [
            parse_frame(line) for line in list_from_file(
                self.ann_file, backend_args=self.backend_args)
            if line.strip()
        ]
        if not frames:
            raise MMSafeFileNotFoundError(f'{owner}: the image list is empty')
        folder, layout, template = self._find_layout(owner, frames)
        self.ann_source = dict(folder=folder, layout=layout,
                               template=template)
        missing: List[MissingPair] = []
        missing_ann: List[str] = []
        entries = []
        for set_id, video, frame in frames:
            img_dir = osp.join(self.data_prefix['img'], set_id, video)
            vis = osp.join(img_dir, self.visible_dir, frame + self.img_suffix)
            ir = osp.join(img_dir, self.infrared_dir, frame + self.img_suffix)
            anns = layout_files(layout, template, folder, set_id, video,
                                frame)
            if self.require_images:
                has_vis = exists(vis, backend_args=self.backend_args)
                has_ir = exists(ir, backend_args=self.backend_args)
                if not (has_vis and has_ir):
                    missing.append((vis, ir, missing_side(has_vis, has_ir)))
                    continue
            absent = [a for a in anns
                      if not exists(a, backend_args=self.backend_args)]
            if absent:
                missing_ann.extend(absent)
                continue
            entries.append((f'{set_id}/{video}/{frame}', vis, ir, anns))
        raise_missing_annotations(
            owner, missing_ann, len(frames),
            f'frames have no annotation file ({LAYOUTS[layout][1]}: '
            f'{osp.join(folder, template)})')
        handle_missing_pairs(owner, missing, len(frames),
                             self.on_missing_pair)
        self._start_reading(owner)
        data_list: List[dict] = []
        malformed: List[MalformedAnnotationError] = []
        for img_id, vis, ir, anns in entries:
            try:
                data_list.append(self.parse_data_info(dict(
                    img_id=img_id, img_path=vis, ir_img_path=ir,
                    ann_paths=anns)))
            except MalformedAnnotationError as err:
                malformed.append(err)
        handle_malformed(self.annotation_tally, malformed, len(entries),
                         self.on_malformed_annotation)
        self.annotation_tally.log_summary(KAIST_LABELS,
                                          "the releases' labels")
        ignored = sum(i['ignore_flag'] for d in data_list
                      for i in d['instances'])
        log(f'{owner}: {len(data_list)} frames, annotations from {folder} '
            f'({LAYOUTS[layout][1]}); {ignored} boxes are ignore regions '
            f'(not person, flagged, lower than {self.min_height} px or '
            f'occlusion > {self.max_occlusion})', logging.INFO)
        return data_list

    # ------------------------------------------------------------ frame
    def _start_reading(self, owner: str) -> None:
        """A new tally and label resolver for a (re)load."""
        self.annotation_tally = AnnotationTally(
            owner, 'kept as ignore regions (not trained on)')
        self._labels = ClassNames(self._metainfo['classes'],
                                  self.class_aliases, owner, KAIST_LABELS)

    def _read(self, path: str) -> List[dict]:
        data = get(path, backend_args=self.backend_args)
        tally = self.annotation_tally

        def on_default(field: str) -> None:
            tally.default_applied(field, path, DEFAULTS[field])

        if path.endswith('.xml'):
            objects = parse_kaist_xml(data, path, on_default)
        else:
            objects = parse_bbgt(data, path, on_default)
        for obj in objects:
            label = tally.read_name(self._labels, obj['label'], path)
            if label is not None:
                obj['label'] = label
        return objects

    def _instance(self, obj: dict) -> dict:
        x1, y1, x2, y2 = obj['bbox']
        valid = (obj['label'] == 'person' and not obj['ign']
                 and y2 - y1 >= self.min_height
                 and obj['occlusion'] <= self.max_occlusion
                 and x2 > x1 and y2 > y1)
        return dict(bbox=obj['bbox'], bbox_label=0,
                    ignore_flag=0 if valid else 1, label_name=obj['label'],
                    occlusion=obj['occlusion'], ign=obj['ign'])

    def parse_data_info(self, raw: dict) -> dict:
        """Parse one frame's annotation file(s) into a data info.

        Raises:
            MalformedAnnotationError: a field of a file is malformed, or
                the two files of a KAIST-Paired frame list different
                numbers of objects.
        """
        if getattr(self, 'annotation_tally', None) is None:
            self._start_reading(type(self).__name__)
        paths = raw['ann_paths']
        with self.annotation_tally.reading():
            objects = [self._read(path) for path in paths]
            if len(paths) == 2:
                pairs = pair_objects(*objects, paths)
        if len(paths) == 2:
            instances = []
            for vis, ir in pairs:
                chosen = vis if self.paired_box == 'visible' else ir
                inst = self._instance(chosen)
                (vx, vy), (ix, iy) = _centre(vis['bbox']), _centre(ir['bbox'])
                inst.update(vis_bbox=vis['bbox'], ir_bbox=ir['bbox'],
                            ir_offset=[ix - vx, iy - vy])
                instances.append(inst)
        else:
            instances = [self._instance(o) for o in objects[0]]
        if self.img_shape is not None:
            height, width = self.img_shape
        else:
            img = mmcv.imfrombytes(
                get(raw['img_path'], backend_args=self.backend_args))
            height, width = img.shape[:2]
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

"""LLVIP: visible + infrared pedestrian pairs with VOC xml annotations."""
import logging
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

from mmengine.fileio import exists, get, list_dir_or_file, list_from_file

from mmdet.datasets import BaseDetDataset
from mmsafe.registry import DATASETS, builds_in_mmsafe_scope
from mmsafe.errors import MMSafeFileNotFoundError, MMSafeValueError
from mmsafe.events import log
from .annotation_reader import MalformedAnnotationError, parse_xml
from .annotation_tally import (AnnotationTally, ClassNames,
                               check_malformed_policy, handle_malformed)
from .box_frame import check_bbox_base, image_size
from .pairing import (MissingPair, check_missing_pair_policy,
                      handle_missing_pairs, missing_side,
                      raise_missing_annotations)
from .synthetic_llvip import ensure_synthetic_llvip
from .transforms.compose import assert_paired_pipeline, paired_pipeline
from .voc_annotations import voc_objects, voc_size

DEFAULT_PREFIX = dict(
    img='visible/train/', ir_img='infrared/train/', ann='Annotations/')


def _default_ir_prefix(img_prefix: str) -> Optional[str]:
    """``visible/test/`` -> ``infrared/test/`` (LLVIP's layout)."""
    parts = img_prefix.replace('\\', '/').split('/')
    if 'visible' not in parts:
        return None
    return '/'.join('infrared' if p == 'visible' else p for p in parts)


@DATASETS.register_module()
class LLVIPDataset(BaseDetDataset):
    """LLVIP (visible + infrared) in its released layout::

        data_root/
          Annotations/{stem}.xml             VOC xml, shared by both splits
          visible/{train,test}/{stem}.jpg
          infrared/{train,test}/{stem}.jpg   same stem as the visible image

    Every data info carries ``img_path`` (visible) and ``ir_img_path``
    (infrared), ``img_id``, ``height``, ``width`` and ``instances`` (``bbox``
    xyxy, ``bbox_label``, ``ignore_flag``; VOC ``difficult`` -> ignored).
    A sample whose partner is missing is an error at build time (the count
    and the first files are named) unless ``on_missing_pair='skip'``, which
    drops it and logs how many were dropped. A pipeline with a geometric or
    mix transform acting on one modality only is refused at build time too
    (:func:`~mmsafe.datasets.transforms.compose.paired_pipeline`), and
    every step is watched at run time
    (:class:`~mmsafe.datasets.transforms.PairedCompose`).

    Boxes are read with the release's coordinate base ``BBOX_BASE``
    (``value - base``; :mod:`~mmsafe.datasets.box_frame`) in the frame of the
    xml's ``<size>``; an xml without a size (or with a zero size) takes the
    visible image's. A size that differs from the image file is kept as
    annotated and reported by ``tools/check_dataset.py``
    (``annotation_size_mismatch``, with the file).

    Every field is read with the format's convention
    (:mod:`~mmsafe.datasets.voc_annotations`): a malformed one (an empty
    ``<name/>``, ``12,5``, text after the root element ...) is an error
    naming the file, the element and its line; all malformed files of the
    split are named together. A missing or empty ``<difficult>`` is 0,
    counted. An object whose name is not in ``classes`` is dropped and
    counted by name in the load log, with the class it matches when only
    case or spacing differs; ``class_aliases`` reads such names as a class
    (:mod:`~mmsafe.datasets.annotation_tally`; ``annotation_tally`` holds
    the counts).

    Coordinate base, checked on real files: 100 LLVIP xml files
    (``010001``-``010100``, 439 boxes, 1280x1024) with their infrared
    images, from the public repository
    ``Abdotest1/pedestrian-detection-using-deep-learning``. Coordinates run
    from 1 to the width/height: 17 values are exactly 1 and none 0, 20 are
    exactly 1280/1024 and none larger, which is PASCAL VOC's 1-based
    numbering (loaded: 0 to width - 1). The same pattern comes from
    labelImg, which LLVIP's annotation tutorial uses: it writes 0-based
    pixel positions but raises a minimum below 1 to 1. Measured on the
    infrared images the two readings differ by one pixel and the measures
    do not agree: the warm silhouette's centre (from the mean brightness
    edges of 389 boxes, 5 blocks of 20 frames) lies 0.24 +- 0.10 px right
    of the box centre read 0-based, 1.24 px read 1-based, which favours
    0-based; per box, right minus left margin of the silhouette is 0.32 +-
    0.32 px on the 205 boxes within 8 px (0-based predicts 0, 1-based 2)
    but 2.09 +- 0.77 px on all 389. One scene, 100 consecutive frames: not
    enough to overturn the format's own convention, so ``BBOX_BASE = 1``;
    ``bbox_base=0`` reads the files as LLVIP's own conversion scripts
    do.

    Args:
        ann_file (str): optional ImageSets file, one stem (or file name) per
            line. Empty: every image in ``data_prefix['img']``.
        data_prefix (dict): folders relative to ``data_root``: ``img``
            (visible), ``ir_img`` (infrared; derived from ``img`` by
            replacing the folder ``visible`` with ``infrared`` when left
            out) and ``ann``. Defaults to the train split.
        return_modality_pair (bool): attach the infrared partner. ``False``
            loads visible images only and says so in the log. Defaults to
            True.
        on_missing_pair (str): ``'error'`` (default) or ``'skip'``.
        img_suffix (str): suffix appended to stems read from ``ann_file``.
            Defaults to ``'.jpg'``.
        img_suffixes (Sequence[str]): image files picked up in folder mode.
        bbox_base (int, optional): the release's coordinate base: 1 (the
            xml numbers the first pixel 1, as PASCAL VOC does: 1 is
            subtracted from every coordinate, as MMDetection's VOC datasets
            do) or 0 (the values are used as they are). None (default):
            the class's ``BBOX_BASE``, the base its release was checked to
            use (see :mod:`~mmsafe.datasets.box_frame`).
        class_aliases (dict, optional): names in the files read as a class,
            e.g. ``dict(Person='person')``. Defaults to None (only the
            class names themselves).
        on_malformed_annotation (str): ``'error'`` (default): malformed
            annotation files stop the build, all named; ``'skip'``: their
            images are left out, counted and logged.
        synthetic (dict, optional): create a deterministic synthetic
            LLVIP-like tree at ``data_root`` on first use, e.g.
            ``dict(num_train=300, num_test=100, img_size=(160, 128),
            seed=0)``; see :func:`ensure_synthetic_llvip`. For demos and
            tests; leave it out for real LLVIP.
        **kwargs: :class:`mmdet.datasets.BaseDetDataset` arguments
            (``data_root``, ``filter_cfg``, ``pipeline``, ``test_mode``,
            ``serialize_data``, ...).
    """

    METAINFO = dict(classes=('person', ), palette=[(220, 20, 60)])
    #: the coordinate base of the release's xml files (see the docstring)
    BBOX_BASE = 1
    #: how the release writes its annotation files, for messages
    ANNOTATION_FORMAT = "LLVIP's xml (PASCAL VOC format)"

    @builds_in_mmsafe_scope
    def __init__(self,
                 *args,
                 data_prefix: Optional[Dict[str, str]] = None,
                 return_modality_pair: bool = True,
                 on_missing_pair: str = 'error',
                 img_suffix: str = '.jpg',
                 img_suffixes: Sequence[str] = ('.jpg', '.jpeg', '.png',
                                                '.bmp'),
                 bbox_base: Optional[int] = None,
                 class_aliases: Optional[Dict[str, str]] = None,
                 on_malformed_annotation: str = 'error',
                 synthetic: Optional[dict] = None,
                 **kwargs) -> None:
        prefix = dict(data_prefix or {})
        prefix.setdefault('img', DEFAULT_PREFIX['img'])
        prefix.setdefault('ann', DEFAULT_PREFIX['ann'])
        if 'ir_img' not in prefix:
            derived = _default_ir_prefix(prefix['img'])
            if derived is None and return_modality_pair:
                raise MMSafeValueError(
                    "LLVIPDataset: data_prefix needs 'ir_img' (the infrared "
                    f"folder); it cannot be derived from img={prefix['img']!r}"
                    " because that path has no 'visible' folder.")
            prefix['ir_img'] = derived or ''
        self.return_modality_pair = return_modality_pair
        self.on_missing_pair = check_missing_pair_policy(on_missing_pair)
        self.img_suffix = img_suffix
        self.img_suffixes = tuple(s.lower() for s in img_suffixes)
        self.bbox_base = check_bbox_base(
            self.BBOX_BASE if bbox_base is None else bbox_base,
            type(self).__name__)
        self.class_aliases = dict(class_aliases or {})
        self.on_malformed_annotation = check_malformed_policy(
            on_malformed_annotation)
        self.synthetic = synthetic
        if synthetic is not None:
            data_root = kwargs.get('data_root')
            if not data_root:
                raise MMSafeValueError(
                    'LLVIPDataset(synthetic=...) needs data_root')
            ensure_synthetic_llvip(data_root, **synthetic)
        if return_modality_pair:
            # before the annotations are read: a broken pipeline fails fast
            assert_paired_pipeline(kwargs.get('pipeline') or [],
                                   f'LLVIPDataset({prefix["img"]})')
        super().__init__(*args, data_prefix=prefix, **kwargs)
        if return_modality_pair:
            # a geometric transform on one modality is refused here, and
            # each sample's steps are watched (PairedCompose)
            self.pipeline = paired_pipeline(
                self.pipeline, f'LLVIPDataset({self.data_prefix["img"]})')

    def _image_names(self) -> List[str]:
        """File names of the visible images, from ImageSets or the folder."""
        if self.ann_file:
            names = []
            for line in list_from_file(
                    self.ann_file, backend_args=self.backend_args):
                line = line.strip()
                if not line:
                    continue
                stem, ext = osp.splitext(line)
                names.append(line if ext.lower() in self.img_suffixes else
                             line + self.img_suffix)
            return names
        img_dir = self.data_prefix['img']
        if not exists(img_dir, backend_args=self.backend_args):
            raise MMSafeFileNotFoundError(
                f'LLVIPDataset: visible image folder {img_dir} does not exist '
                f'(data_root={self.data_root!r}, '
                f"data_prefix['img']={self.data_prefix['img']!r})")
        return sorted(
            list_dir_or_file(
                img_dir,
                list_dir=False,
                suffix=self.img_suffixes + tuple(
                    s.upper() for s in self.img_suffixes),
                recursive=False,
                backend_args=self.backend_args))

    def pair_paths(self, name: str) -> Tuple[str, str, str, str]:
        """``(img_id, visible, infrared, xml)`` paths of visible image
        ``name``: the same file name in both folders, ``{stem}.xml``."""
        stem = osp.splitext(name)[0]
        return (stem, osp.join(self.data_prefix['img'], name),
                osp.join(self.data_prefix['ir_img'], name),
                osp.join(self.data_prefix['ann'], f'{stem}.xml'))

    def load_data_list(self) -> List[dict]:
        """Build one data info per visible image, with its partner."""
        self.cat2label = {
            cat: i
            for i, cat in enumerate(self._metainfo['classes'])
        }
        owner = f'{type(self).__name__}({self.data_prefix["img"]})'
        if not self.return_modality_pair:
            log(f'{owner}: return_modality_pair=False: VISIBLE images only, '
                'no infrared partner is attached, so paired transforms and '
                'dual-stream models will refuse these samples. Set '
                'return_modality_pair=True (the default) for visible + '
                'infrared.', logging.WARNING)
        names = self._image_names()
        missing: List[MissingPair] = []
        missing_ann: List[str] = []
        entries = []
        for name in names:
            stem, img_path, ir_path, xml_path = self.pair_paths(name)
            # folder mode lists existing visible files; ImageSets may not
            has_vis = not self.ann_file or exists(
                img_path, backend_args=self.backend_args)
            has_ir = (not self.return_modality_pair) or exists(
                ir_path, backend_args=self.backend_args)
            if not (has_vis and has_ir):
                missing.append(
                    (img_path, ir_path, missing_side(has_vis, has_ir)))
                continue
            if not exists(xml_path, backend_args=self.backend_args):
                missing_ann.append(xml_path)
                continue
            entries.append((stem, img_path, ir_path, xml_path))
        raise_missing_annotations(
            owner, missing_ann, len(names),
            f'images have no annotation xml in {self.data_prefix["ann"]}')
        if not names:
            raise MMSafeFileNotFoundError(
                f'{owner}: no images found (ann_file={self.ann_file!r})')
        handle_missing_pairs(owner, missing, len(names), self.on_missing_pair)

        data_list = []
        self._degenerate = 0
        self._start_reading(owner)
        malformed: List[MalformedAnnotationError] = []
        for stem, img_path, ir_path, xml_path in entries:
            try:
                info = self.parse_data_info(
                    dict(img_id=stem, img_path=img_path, xml_path=xml_path))
            except MalformedAnnotationError as err:
                malformed.append(err)
                continue
            if self.return_modality_pair:
                info['ir_img_path'] = ir_path
            data_list.append(info)
        handle_malformed(self.annotation_tally, malformed, len(entries),
                         self.on_malformed_annotation)
        self.annotation_tally.log_summary(self._metainfo['classes'])
        if self._degenerate:
            log(f'{owner}: {self._degenerate} boxes with zero or negative '
                'width/height are kept as ignored (ignore_flag=1)',
                logging.WARNING)
        return data_list

    def _start_reading(self, owner: str) -> None:
        """A new tally and class-name resolver for a (re)load."""
        self.annotation_tally = AnnotationTally(owner, 'dropped')
        self._class_names = ClassNames(self._metainfo['classes'],
                                       self.class_aliases, owner)

    def parse_data_info(self, raw: dict) -> dict:
        """Parse one VOC xml into a data info.

        Args:
            raw (dict): ``img_id``, ``img_path`` and ``xml_path``.

        Returns:
            dict: the data info (without ``ir_img_path``).

        Raises:
            MalformedAnnotationError: a field of the file is malformed.
        """
        if getattr(self, 'annotation_tally', None) is None:
            self._start_reading(type(self).__name__)
        tally = self.annotation_tally
        with tally.reading():
            doc = parse_xml(
                get(raw['xml_path'], backend_args=self.backend_args),
                raw['xml_path'],
                f'{self.ANNOTATION_FORMAT}, read by {type(self).__name__}')
            size = voc_size(doc, tally)
            objects = voc_objects(doc, self.bbox_base, self._class_names,
                                  tally)
        # the xml's <size> is the frame of its boxes; without one (or with
        # a zero size) the image file's header says it
        if size is None:
            size = image_size(
                get(raw['img_path'], backend_args=self.backend_args),
                raw['img_path'])
        width, height = size
        instances = []
        for obj in objects:
            bbox = obj['bbox']
            degenerate = bbox[2] <= bbox[0] or bbox[3] <= bbox[1]
            self._degenerate = getattr(self, '_degenerate', 0) + degenerate
            instances.append(
                dict(
                    bbox=bbox,
                    bbox_label=self.cat2label[obj['name']],
                    ignore_flag=int(bool(obj['difficult']) or degenerate)))
        return dict(
            img_id=raw['img_id'],
            img_path=raw['img_path'],
            xml_path=raw['xml_path'],
            height=height,
            width=width,
            instances=instances)

    def filter_data(self) -> List[dict]:
        """Filter images without annotations or smaller than ``min_size``
        (``filter_cfg=dict(filter_empty_gt=True, min_size=0)``)."""
        if self.test_mode or not self.filter_cfg:
            return self.data_list
        filter_empty_gt = self.filter_cfg.get('filter_empty_gt', False)
        min_size = self.filter_cfg.get('min_size', 0)
        kept = [
            info for info in self.data_list
            if not (filter_empty_gt and not any(
                i['ignore_flag'] == 0 for i in info['instances']))
            and min(info['width'], info['height']) >= min_size
        ]
        if len(kept) < len(self.data_list):
            log(f'LLVIPDataset: filter_cfg={self.filter_cfg} removed '
                f'{len(self.data_list) - len(kept)} of {len(self.data_list)} '
                'images')
        return kept


__all__ = ['LLVIPDataset']

"""Make any MMDetection detection dataset visible + infrared paired."""
import copy
import json
import os
import os.path as osp
import re
import xml.etree.ElementTree as ET
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
from mmengine.dataset import BaseDataset, Compose
from mmengine.fileio import exists, get_local_path

from mmsafe.registry import DATASETS, builds_in_mmsafe_scope
from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError
from .transforms.compose import assert_paired_pipeline, paired_pipeline
from .pairing import (MissingPair, check_missing_pair_policy,
                      handle_missing_pairs, missing_side)


class PartnerRule:
    """How to find the infrared partner of a visible image.

    One of:

    * ``dict(find='/visible/', replace='/infrared/')``: plain substring
      substitution in ``img_path``;
    * ``dict(pattern=r'(.*)/RGB/(\\w+)\\.jpg', repl=r'\\1/IR/\\2.png')``: a
      regular expression (``re.sub``) on ``img_path``;
    * ``dict(field='ir_file_name', prefix=None)``: a field of the data info,
      else of the annotation: the image entry of a COCO json (matched by
      ``img_id``) or a child element of a VOC xml (``xml_path``). Relative
      values are joined with ``prefix`` (default: the inner dataset's
      ``data_prefix['img']``, else the visible image's folder).

    A rule that does not apply to an image, or gives back the visible path
    itself, counts as a missing partner for that image.
    """

    def __init__(self, rule: Dict[str, Any]) -> None:
        rule = dict(rule)
        if 'find' in rule and 'replace' in rule:
            self.mode = 'find/replace'
        elif 'pattern' in rule and 'repl' in rule:
            self.mode = 'pattern/repl'
            re.compile(rule['pattern'])  # fail at build on a bad regex
        elif 'field' in rule:
            self.mode = 'field'
        else:
            raise MMSafeValueError(
                f'partner must be one of dict(find=..., replace=...), '
                f'dict(pattern=..., repl=...), dict(field=..., prefix=...); '
                f'got {rule}')
        self.rule = rule
        # annotation file caches for field mode (not pickled: rebuilt lazily)
        self._coco_fields: Optional[Dict[Any, Any]] = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_coco_fields'] = None
        return state

    def _field_from_annotation(self, info: dict, dataset: Any) -> Any:
        field = self.rule['field']
        xml_path = info.get('xml_path')
        if xml_path:
            with get_local_path(xml_path) as local:
                node = ET.parse(local).getroot().find(field)
            return None if node is None or not node.text else node.text.strip()
        ann_file = getattr(dataset, 'ann_file', '')
        if ann_file and ann_file.endswith('.json'):
            if self._coco_fields is None:
                with get_local_path(ann_file) as local, open(
                        local, encoding='utf-8') as f:
                    images = json.load(f).get('images', [])
                self._coco_fields = {
                    img['id']: img[field]
                    for img in images if field in img
                }
            return self._coco_fields.get(info.get('img_id'))
        return None

    def resolve(self, info: dict, dataset: Any) -> Optional[str]:
        """Partner path of ``info``, or None when the rule does not apply."""
        img_path = info['img_path']
        if os.sep != '/':
            # rules are written with '/'; Windows paths may mix separators
            img_path = img_path.replace(os.sep, '/')
        if self.mode == 'find/replace':
            if self.rule['find'] not in img_path:
                return None
            partner = img_path.replace(self.rule['find'], self.rule['replace'])
        elif self.mode == 'pattern/repl':
            partner, count = re.subn(self.rule['pattern'], self.rule['repl'],
                                     img_path)
            if count == 0:
                return None
        else:
            value = info.get(self.rule['field'])
            if value is None:
                value = self._field_from_annotation(info, dataset)
            if not value:
                return None
            value = str(value)
            if not osp.isabs(value):
                prefix = self.rule.get('prefix')
                if prefix is None:
                    prefix = getattr(dataset, 'data_prefix', {}).get(
                        'img') or osp.dirname(img_path)
                value = osp.join(prefix, value)
            partner = value
        return None if partner == img_path else partner


@DATASETS.register_module()
class PairedModalityDataset:
    """Attach an infrared partner (``ir_img_path``) to every sample of an
    MMDetection detection dataset (VOC or COCO style: KAIST, aligned FLIR,
    M3FD, ...).

    Partners are found and checked when the dataset is built: a missing
    partner is an error naming the count and the first files, or with
    ``on_missing_pair='skip'`` the sample is dropped and the count logged.
    A pipeline with a geometric or mix transform acting on one modality
    only is refused when it is built, and every step is watched at run
    time (:class:`~mmsafe.datasets.transforms.PairedCompose`).

    Args:
        dataset (dict | BaseDataset): the visible dataset (config or object).
        partner (dict): how to find the partner image, see
            :class:`PartnerRule`.
        pipeline (list): the paired pipeline. If empty, the inner dataset's
            pipeline is used (it then runs on the paired data info). Giving
            both is an error.
        on_missing_pair (str): ``'error'`` (default) or ``'skip'``.
        lazy_init (bool): defer finding partners until first use.
        max_refetch (int): retries when the pipeline returns None in
            training, as :class:`mmengine.dataset.BaseDataset`.
    """

    @builds_in_mmsafe_scope
    def __init__(self,
                 dataset: Union[dict, BaseDataset],
                 partner: Dict[str, Any],
                 pipeline: Sequence[Union[dict, Callable]] = (),
                 on_missing_pair: str = 'error',
                 lazy_init: bool = False,
                 max_refetch: int = 1000) -> None:
        if pipeline:
            # before the inner dataset reads its annotations
            assert_paired_pipeline(list(pipeline), 'PairedModalityDataset')
        if isinstance(dataset, dict):
            dataset = DATASETS.build(dataset)
        self.dataset = dataset
        self.partner_rule = PartnerRule(partner)
        self.on_missing_pair = check_missing_pair_policy(on_missing_pair)
        inner_pipeline = getattr(dataset, 'pipeline', None)
        inner_steps = getattr(inner_pipeline, 'transforms', [])
        if pipeline and inner_steps:
            raise MMSafeValueError(
                'PairedModalityDataset: give the pipeline either to the '
                'wrapper or to the inner dataset, not both (the inner one '
                'would run a second time).')
        self.pipeline = paired_pipeline(
            Compose(list(pipeline)) if pipeline else
            (inner_pipeline or Compose([])),
            f'PairedModalityDataset({type(dataset).__name__})')
        self.test_mode = getattr(dataset, 'test_mode', False)
        self.max_refetch = max_refetch
        self._fully_initialized = False
        if not lazy_init:
            self.full_init()

    @property
    def metainfo(self) -> dict:
        """The inner dataset's meta information."""
        return copy.deepcopy(self.dataset.metainfo)

    def full_init(self) -> None:
        """Find and check every sample's partner once."""
        if self._fully_initialized:
            return
        self.dataset.full_init()
        keep: List[int] = []
        partners: List[str] = []
        missing: List[MissingPair] = []
        for idx in range(len(self.dataset)):
            info = self.dataset.get_data_info(idx)
            img_path = info['img_path']
            ir_path = self.partner_rule.resolve(info, self.dataset)
            if ir_path is None:
                missing.append((img_path, '?',
                                f'partner rule {self.partner_rule.rule} does '
                                'not apply'))
                continue
            has_vis, has_ir = exists(img_path), exists(ir_path)
            if not (has_vis and has_ir):
                missing.append(
                    (img_path, ir_path, missing_side(has_vis, has_ir)))
                continue
            keep.append(idx)
            partners.append(ir_path)
        owner = (f'PairedModalityDataset({type(self.dataset).__name__}, '
                 f'{getattr(self.dataset, "data_root", "")!r})')
        handle_missing_pairs(owner, missing, len(self.dataset),
                             self.on_missing_pair)
        # numpy arrays: no per-item refcounts in forked workers, and cheap
        # to pickle for spawned ones
        self._indices = np.asarray(keep, dtype=np.int64)
        self._partners = np.asarray(partners, dtype=np.str_)
        self._fully_initialized = True

    def _ensure_init(self) -> None:
        if not self._fully_initialized:
            self.full_init()

    def get_data_info(self, idx: int) -> dict:
        """The inner data info of sample ``idx`` plus ``ir_img_path``."""
        self._ensure_init()
        info = self.dataset.get_data_info(int(self._indices[idx]))
        info['ir_img_path'] = str(self._partners[idx])
        info['sample_idx'] = idx if idx >= 0 else len(self) + idx
        return info

    def get_cat_ids(self, idx: int) -> List[int]:
        """Category ids of sample ``idx``."""
        self._ensure_init()
        return self.dataset.get_cat_ids(int(self._indices[idx]))

    def prepare_data(self, idx: int) -> Any:
        """The paired data info of ``idx`` after the pipeline."""
        return self.pipeline(self.get_data_info(idx))

    def __len__(self) -> int:
        self._ensure_init()
        return len(self._indices)

    def __getitem__(self, idx: int) -> Any:
        self._ensure_init()
        if self.test_mode:
            data = self.prepare_data(idx)
            if data is None:
                raise MMSafeRuntimeError(
                    'PairedModalityDataset: the test pipeline returned None '
                    f'for {self.get_data_info(idx)["img_path"]}')
            return data
        for _ in range(self.max_refetch + 1):
            data = self.prepare_data(idx)
            if data is not None:
                return data
            idx = np.random.randint(0, len(self))
        raise MMSafeRuntimeError(
            f'PairedModalityDataset: no valid sample after {self.max_refetch} '
            'retries; check the image paths and the pipeline')

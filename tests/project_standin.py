"""The source of a stand-in RGB-T project, as the tests write it to a
folder of their own (tests/test_project_guards.py): a module that
registers its own classes in MMDetection's registries under the field's
common names, and carries the second modality its own way.

* ``LLVIPDataset``: LLVIP-style folders; the infrared partner found by a
  lookup before MMEngine serialises the data list (``partner_lookup=
  'before'``), or after it (``'serialised'``: the list is empty by then,
  nothing is found and every sample goes on visible-only, silently);
  ``ir_offset`` pairs frame ``i`` with infrared frame ``i + offset``;
  ``pipeline_twice`` makes the infrared image by running the whole
  pipeline a second time (its random flip drawn again); ``faults`` maps a
  sample index to fault kinds (``'empty'``: no boxes; ``'nan_loss'``,
  ``'hidden_nan'``: read by the model).
* ``LoadPairedImageFromFile``: the visible image in ``results['img']``,
  the infrared one in ``results['img_lwir']``, its file in
  ``results['lwir_path']``.
* ``PairedRandomFlip``: one draw for both images and the boxes.
* ``PairedToContiguous``: holds a lambda (unpicklable: a spawn-started
  loader worker cannot get it).
* ``PackPairedInputs``: the visible image as ``inputs``, the infrared one
  as the data samples' ``infrared_img`` field.
* ``PairedDetDataPreprocessor``: normalises both, hands the model a dict
  ``{'rgb': ..., 'lwir': ...}`` (``layout='dict'``) or one 6-channel
  tensor (``layout='channels'``); a missing partner becomes the visible
  image again, silently; ``hold_lambda`` keeps a lambda that stands in
  for the channel conversion (its own ``bgr_to_rgb`` is then ignored).
* ``TwoStreamFasterRCNN`` with ``ContrastRoIHead`` and ``MACLHead``: one
  stem per modality, a RoI head whose losses come as a nested dict (the
  contrastive term under its own key, ``loss_contrast``, weighted 0.5),
  flattened by the detector with a ``roi.`` prefix. The RoI head passes its
  classification and box terms through ``nan_to_num`` (``nan_to_num``),
  puts a detached zero in place of the box term when no image has a box,
  and catches the contrastive head's errors, printing them
  (``vanish_rank``/``vanish_at``: a shape error from that iteration on, on
  that rank); ``loss_total`` adds a ``loss_total`` of the other terms.
"""

SOURCE = r'''
"""A stand-in RGB-T project (written by mmsafe's tests)."""
import glob
import os.path as osp
import xml.etree.ElementTree as ET

import mmcv
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.transforms import BaseTransform
from mmdet.datasets import BaseDetDataset
from mmdet.models.data_preprocessors import DetDataPreprocessor
from mmdet.registry import DATASETS, MODELS, TRANSFORMS
from mmdet.structures import DetDataSample
from mmengine.dist import get_rank
from mmengine.logging import MessageHub
from mmengine.model import BaseModel, BaseModule
from mmengine.structures import InstanceData


@DATASETS.register_module()
class LLVIPDataset(BaseDetDataset):
    METAINFO = dict(classes=('person', ))

    def __init__(self, *args, partner_lookup='before', ir_offset=0,
                 pipeline_twice=False, faults=None, **kwargs):
        self.partner_lookup = partner_lookup
        self.ir_offset = ir_offset
        self.pipeline_twice = pipeline_twice
        self.faults = {int(k): list(v) for k, v in (faults or {}).items()}
        self.partners = {}
        super().__init__(*args, **kwargs)

    def _infrared_files(self):
        return sorted(glob.glob(osp.join(self.data_root, 'infrared', 'train',
                                         '*.jpg')))

    def load_data_list(self):
        infos = []
        for path in sorted(glob.glob(osp.join(self.data_root, 'visible',
                                              'train', '*.jpg'))):
            stem = osp.splitext(osp.basename(path))[0]
            root = ET.parse(osp.join(self.data_root, 'Annotations',
                                     stem + '.xml')).getroot()
            instances = []
            for obj in root.iter('object'):
                box = obj.find('bndbox')
                instances.append(dict(bbox=[float(box.find(k).text) for k in
                                            ('xmin', 'ymin', 'xmax', 'ymax')],
                                      bbox_label=0, ignore_flag=0))
            index = len(infos)
            if 'empty' in self.faults.get(index, []):
                instances = []
            infos.append(dict(img_path=path, img_id=stem, instances=instances,
                              faults=self.faults.get(index, [])))
        if self.partner_lookup == 'before':
            irs = self._infrared_files()
            self.partners = {i: irs[(i + self.ir_offset) % len(irs)]
                             for i in range(len(infos))}
        return infos

    def full_init(self):
        super().full_init()
        if self.partner_lookup == 'serialised':
            # the lookup reads self.data_list, which MMEngine's
            # serialisation has emptied by now
            irs = self._infrared_files()
            self.partners = {i: irs[i] for i, _ in enumerate(self.data_list)}

    def get_data_info(self, idx):
        info = super().get_data_info(idx)
        info['lwir_path'] = self.partners.get(idx)
        return info

    def prepare_data(self, idx):
        info = self.get_data_info(idx)
        if not self.pipeline_twice:
            return self.pipeline(info)
        partner = info.pop('lwir_path')
        out = self.pipeline(dict(info))
        infrared = self.pipeline(dict(info, img_path=partner))
        out['data_samples'].infrared_img = infrared['inputs']
        out['data_samples'].set_metainfo(dict(lwir_path=partner))
        return out


@TRANSFORMS.register_module()
class LoadPairedImageFromFile(BaseTransform):

    def transform(self, results):
        img = mmcv.imread(results['img_path'])
        results['img'] = img
        results['img_shape'] = results['ori_shape'] = img.shape[:2]
        results['lwir_path'] = results.get('lwir_path')
        if results['lwir_path']:
            results['img_lwir'] = mmcv.imread(results['lwir_path'])
        boxes = [i['bbox'] for i in results['instances']]
        results['gt_bboxes'] = np.array(boxes, np.float32).reshape(-1, 4)
        return results


@TRANSFORMS.register_module()
class PairedRandomFlip(BaseTransform):

    def __init__(self, prob=0.5):
        self.prob = prob

    def transform(self, results):
        flip = bool(np.random.rand() < self.prob)
        results['flip'] = flip
        results['flip_direction'] = 'horizontal' if flip else None
        if flip:
            width = results['img'].shape[1]
            results['img'] = results['img'][:, ::-1].copy()
            if results.get('img_lwir') is not None:
                results['img_lwir'] = results['img_lwir'][:, ::-1].copy()
            b = results['gt_bboxes']
            results['gt_bboxes'] = np.stack(
                [width - b[:, 2], b[:, 1], width - b[:, 0], b[:, 3]], 1)
        return results


@TRANSFORMS.register_module()
class PairedToContiguous(BaseTransform):

    def __init__(self):
        self.convert = lambda img: np.ascontiguousarray(img)

    def transform(self, results):
        results['img'] = self.convert(results['img'])
        return results


def _chw(img):
    return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))


@TRANSFORMS.register_module()
class PackPairedInputs(BaseTransform):

    def transform(self, results):
        sample = DetDataSample(metainfo=dict(
            img_id=results['img_id'], img_path=results['img_path'],
            lwir_path=results.get('lwir_path'),
            ori_shape=results['ori_shape'],
            img_shape=results['img'].shape[:2], scale_factor=(1.0, 1.0),
            flip=results.get('flip', False),
            flip_direction=results.get('flip_direction'),
            faults=results.get('faults', [])))
        gt = InstanceData()
        gt.bboxes = torch.from_numpy(results['gt_bboxes']).float()
        gt.labels = torch.zeros(len(gt.bboxes), dtype=torch.long)
        sample.gt_instances = gt
        if results.get('img_lwir') is not None:
            sample.infrared_img = _chw(results['img_lwir'])
        return dict(inputs=_chw(results['img']), data_samples=sample)


@MODELS.register_module()
class PairedDetDataPreprocessor(DetDataPreprocessor):

    def __init__(self, layout='dict', keys=('rgb', 'lwir'),
                 hold_lambda=False, **kwargs):
        super().__init__(**kwargs)
        self.layout = layout
        self.keys = tuple(keys)
        self.convert = (lambda x: x) if hold_lambda else None

    def _prepare(self, images, shape):
        out = []
        for img in images:
            x = img.float()
            if self.convert is not None:
                x = self.convert(x)
            elif self._channel_conversion:
                x = x[[2, 1, 0]]
            x = (x - self.mean) / self.std
            x = F.pad(x, (0, shape[1] - x.shape[2], 0, shape[0] - x.shape[1]),
                      value=self.pad_value)
            out.append(x)
        return torch.stack(out)

    def forward(self, data, training=False):
        data = self.cast_data(data)
        samples = data['data_samples']
        visible = list(data['inputs'])
        infrared = [getattr(s, 'infrared_img', None) for s in samples]
        if any(x is None for x in infrared):
            infrared = visible  # a missing partner: the visible image again
        d = self.pad_size_divisor
        h = max(x.shape[1] for x in visible)
        w = max(x.shape[2] for x in visible)
        shape = (-(-h // d) * d, -(-w // d) * d)
        for s in samples:
            s.set_metainfo(dict(batch_input_shape=shape, pad_shape=shape))
        vis, ir = self._prepare(visible, shape), self._prepare(infrared, shape)
        inputs = {self.keys[0]: vis, self.keys[1]: ir} \
            if self.layout == 'dict' else torch.cat([vis, ir], 1)
        return dict(inputs=inputs, data_samples=samples)


@MODELS.register_module()
class MACLHead(BaseModule):

    def __init__(self, in_dim=8, proj_dim=8, loss_weight=0.5):
        super().__init__()
        self.proj_v = nn.Linear(in_dim, proj_dim)
        self.proj_i = nn.Linear(in_dim, proj_dim)
        self.loss_weight = loss_weight

    def loss(self, vis, ir):
        zv = F.normalize(self.proj_v(vis), dim=1)
        zi = F.normalize(self.proj_i(ir), dim=1)
        logits = zv @ zi.t() / 0.1
        target = torch.arange(len(zv))
        return self.loss_weight * (F.cross_entropy(logits, target) +
                                   F.cross_entropy(logits.t(), target)) / 2


@MODELS.register_module()
class ContrastRoIHead(BaseModule):

    def __init__(self, in_dim=8, macl=None, nan_to_num=False,
                 vanish_rank=None, vanish_at=None):
        super().__init__()
        self.cls = nn.Linear(in_dim, 2)
        self.reg = nn.Linear(in_dim, 4)
        self.macl = MODELS.build(macl or dict(type='MACLHead'))
        self.nan_to_num = nan_to_num
        self.vanish_rank = vanish_rank
        self.vanish_at = vanish_at
        self._printed = False

    def loss(self, fused, vis, ir, samples, paired):
        faults = {f for s in samples for f in s.metainfo.get('faults', [])}
        has = [len(s.gt_instances) > 0 for s in samples]
        logits = self.cls(fused)
        if 'hidden_nan' in faults:
            logits = logits * float('nan')
        losses = dict(loss_cls=F.cross_entropy(
            logits, torch.tensor(has, dtype=torch.long)))
        if any(has):
            idx = [k for k, h in enumerate(has) if h]
            target = torch.stack([samples[k].gt_instances.bboxes[0] / 160.
                                  for k in idx])
            losses['loss_bbox'] = F.l1_loss(self.reg(fused[idx]), target)
        else:
            # no box in the batch: a detached zero stands in for the term
            losses['loss_bbox'] = fused.new_zeros(())
        if self.nan_to_num:
            losses = {k: torch.nan_to_num(v) for k, v in losses.items()}
        if paired:
            it = MessageHub.get_current_instance().get_info('iter') or 0
            try:
                if self.vanish_at is not None and get_rank() == \
                        self.vanish_rank and it + 1 >= self.vanish_at:
                    raise RuntimeError('mat1 and mat2 shapes cannot be '
                                       'multiplied (4x1024 and 256x8)')
                if 'nan_loss' in faults:
                    vis = vis * float('nan')
                losses['macl'] = dict(loss_contrast=self.macl.loss(vis, ir))
            except RuntimeError as err:  # the project's: printed, once
                if not self._printed:
                    print(f'MACL skipped: {err}', flush=True)
                    self._printed = True
        return losses


@MODELS.register_module()
class TwoStreamFasterRCNN(BaseModel):

    def __init__(self, data_preprocessor=None, roi_head=None,
                 keys=('rgb', 'lwir'), loss_total=False):
        super().__init__(data_preprocessor=data_preprocessor)
        self.vis_stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU())
        self.ir_stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU())
        self.roi_head = MODELS.build(roi_head or dict(type='ContrastRoIHead'))
        self.keys = tuple(keys)
        self.loss_total = loss_total

    def forward(self, inputs, data_samples=None, mode='tensor'):
        if isinstance(inputs, dict):
            vis, ir = inputs[self.keys[0]], inputs[self.keys[1]]
        else:
            vis, ir = inputs[:, :3], inputs[:, 3:]
        fv = self.vis_stem(vis).mean((2, 3))
        fi = self.ir_stem(ir).mean((2, 3))
        if mode != 'loss':
            return fv + fi
        paired = all(s.metainfo.get('lwir_path') for s in data_samples)
        losses = {}
        for key, value in self.roi_head.loss(fv + fi, fv, fi, data_samples,
                                             paired).items():
            if isinstance(value, dict):  # a nested dict of the RoI head
                for inner, term in value.items():
                    losses[f'roi.{key}.{inner}'] = term
            else:
                losses[f'roi.{key}'] = value
        if self.loss_total:
            losses['loss_total'] = sum(losses.values())
        return losses
'''

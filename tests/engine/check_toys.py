"""Tiny fault-injecting components for the check-hook tests.

A paired toy task: each sample is a visible and an infrared 8x8 image of a
flat colour. The infrared colour is a fixed function of the visible one
(``aligned``) or the colour of a random other sample (``shuffled``: broken
pairing). The model has one conv encoder per modality, a classifier on the
fused features (``loss_cls`` through MMDetection's ``CrossEntropyLoss``)
and mmsafe's real :class:`MACLHead`. Faults are switched on by config.
"""
import threading
import time
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.dataset import BaseDataset
from mmengine.dist import get_rank
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.structures import BaseDataElement

from mmdet.registry import DATASETS, METRICS, MODELS


def _colour(index: int) -> np.ndarray:
    return np.random.default_rng(1000 + index).normal(size=3).astype(
        np.float32)


def _ir_colour(colour: np.ndarray) -> np.ndarray:
    return np.array([colour[1], -colour[2], colour[0]], dtype=np.float32)


@DATASETS.register_module()
class ToyPairDataset(BaseDataset):
    """Paired flat-colour images; ``pairing='shuffled'`` breaks pairs.

    ``fail_rank`` / ``fail_after``: on that rank, loading a sample raises
    (as a broken transform would) once ``fail_after`` samples were loaded
    in this process; with ``linger_s`` a non-daemon thread then keeps the
    process alive that long (a shutdown that hangs). ``sleep_rank`` /
    ``sleep_after`` / ``sleep_s``: on that rank, loading sleeps once
    (a slow file system), outside any collective.
    """

    def __init__(self, num_samples: int = 64, pairing: str = 'aligned',
                 fail_rank: Optional[int] = None, fail_after: int = 0,
                 linger_s: float = 0.0, sleep_rank: Optional[int] = None,
                 sleep_after: int = 0, sleep_s: float = 0.0,
                 **kwargs) -> None:
        self.num_samples = num_samples
        self.pairing = pairing
        self.fail_rank = fail_rank
        self.fail_after = fail_after
        self.linger_s = linger_s
        self.sleep_rank = sleep_rank
        self.sleep_after = sleep_after
        self.sleep_s = sleep_s
        self.num_loaded = 0
        super().__init__(lazy_init=False, serialize_data=False, **kwargs)

    def load_data_list(self):
        return [dict(idx=i) for i in range(self.num_samples)]

    def prepare_data(self, idx: int) -> dict:
        self.num_loaded += 1
        if (self.sleep_rank == get_rank() and self.sleep_s
                and self.num_loaded == self.sleep_after + 1):
            time.sleep(self.sleep_s)
        if (self.fail_rank == get_rank()
                and self.num_loaded > self.fail_after):
            if self.linger_s:
                threading.Thread(target=time.sleep, args=(self.linger_s, ),
                                 daemon=False).start()
            raise ValueError(f'toy transform failed on sample {idx} '
                             f'(rank {get_rank()})')
        colour = _colour(idx)
        if self.pairing == 'shuffled':
            partner = int(np.random.randint(0, 1 << 30))
            ir_colour = _ir_colour(_colour(self.num_samples + partner))
        else:
            ir_colour = _ir_colour(colour)
        noise = np.random.default_rng(idx).normal(
            scale=0.05, size=(2, 3, 8, 8)).astype(np.float32)
        visible = torch.from_numpy(colour[:, None, None] + noise[0])
        infrared = torch.from_numpy(ir_colour[:, None, None] + noise[1])
        sample = BaseDataElement(
            metainfo=dict(img_path=f'toy/visible/{idx}.png',
                          ir_img_path=f'toy/infrared/{idx}.png', idx=idx),
            gt_label=torch.tensor(int(colour[0] > 0)))
        return dict(inputs=dict(visible=visible, infrared=infrared),
                    data_samples=sample)


@MODELS.register_module()
class ToyUnweightedCELoss(nn.Module):
    """A loss with a ``loss_weight`` it never applies (the fault)."""

    def __init__(self, loss_weight: float = 1.0) -> None:
        super().__init__()
        self.loss_weight = loss_weight

    def forward(self, logits, labels):
        return F.cross_entropy(logits, labels)


@MODELS.register_module()
class ToyPairModel(BaseModel):
    """Two-stream toy classifier with a MACL head and optional faults.

    Args:
        macl (bool): Build the MACL head.
        loss_cls (dict): Classification loss config.
        drop_macl_on_rank (int, optional): Leave ``loss_macl`` out of the
            loss dict on this rank (as a swallowed exception around it
            would).
        double_count (bool): Also return ``loss_total`` computed from the
            other losses.
        grad_log_key (bool): Return a grad-carrying ``macl_similarity``.
        nan_at_iter (int, optional): Make ``loss_cls`` NaN from this forward
            call on (0-based) on ``nan_rank`` (None: every rank).
        macl_fault (str, optional): From forward call ``macl_fault_at`` on
            (0-based): ``'vanish'`` (``loss_macl`` leaves the loss dict, as
            when an exception around it is swallowed), ``'constant'`` (a
            fixed detached value replaces it) or ``'detach'`` (the real
            value, detached from the head).
        macl_fault_at (int): See ``macl_fault``.
        macl_fault_rank (int, optional): Only this rank has ``macl_fault``
            (None: every rank).
        skip_ir_rank (int, optional): From forward call ``skip_ir_at`` on
            (0-based), this rank skips the infrared encoder (zeros instead
            of its features: a branch left out, the loss keys unchanged).
        skip_ir_at (int): See ``skip_ir_rank``.
        spare (bool): Add a module that no loss uses (on every rank).
    """

    def __init__(self,
                 macl: bool = True,
                 loss_cls: Optional[dict] = None,
                 macl_weight: float = 1.0,
                 drop_macl_on_rank: Optional[int] = None,
                 double_count: bool = False,
                 grad_log_key: bool = False,
                 nan_at_iter: Optional[int] = None,
                 nan_rank: Optional[int] = None,
                 macl_fault: Optional[str] = None,
                 macl_fault_at: int = 0,
                 macl_fault_rank: Optional[int] = None,
                 skip_ir_rank: Optional[int] = None,
                 skip_ir_at: int = 0,
                 spare: bool = False) -> None:
        super().__init__()
        self.vis_enc = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1),
                                     nn.ReLU())
        self.ir_enc = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1),
                                    nn.ReLU())
        self.cls = nn.Linear(16, 2)
        self.loss_cls = MODELS.build(loss_cls or dict(
            type='CrossEntropyLoss', loss_weight=1.0))
        self.macl_head = MODELS.build(
            dict(type='mmsafe.MACLHead', in_dim=16, proj_dim=16,
                 hidden_dim=32, loss_weight=macl_weight)) if macl else None
        self.drop_macl_on_rank = drop_macl_on_rank
        self.double_count = double_count
        self.grad_log_key = grad_log_key
        self.nan_at_iter = nan_at_iter
        self.nan_rank = nan_rank
        assert macl_fault in (None, 'vanish', 'constant', 'detach')
        self.macl_fault = macl_fault
        self.macl_fault_at = macl_fault_at
        self.macl_fault_rank = macl_fault_rank
        self.skip_ir_rank = skip_ir_rank
        self.skip_ir_at = skip_ir_at
        self.spare = nn.Linear(2, 2) if spare else None
        self.num_loss_calls = 0

    def forward(self, inputs, data_samples=None, mode='tensor'):
        vis = torch.stack(inputs['visible'])
        ir = torch.stack(inputs['infrared'])
        vis_feat, ir_feat = self.vis_enc(vis), self.ir_enc(ir)
        if (mode == 'loss' and self.skip_ir_rank == get_rank()
                and self.num_loss_calls >= self.skip_ir_at):
            ir_feat = torch.zeros_like(ir_feat).detach()
        logits = self.cls((vis_feat + ir_feat).mean((2, 3)))
        labels = torch.stack([s.gt_label for s in data_samples])
        if mode == 'predict':
            out = []
            probs = logits.softmax(1)
            for sample, pred, prob in zip(data_samples, logits.argmax(1),
                                          probs):
                result = BaseDataElement(metainfo=sample.metainfo)
                result.pred_label = pred
                result.gt_score = prob[sample.gt_label]
                result.gt_label = sample.gt_label
                out.append(result)
            return out
        losses = dict(loss_cls=self.loss_cls(logits, labels))
        if (self.nan_at_iter is not None and
                self.num_loss_calls >= self.nan_at_iter and
                self.nan_rank in (None, get_rank())):
            losses['loss_cls'] = losses['loss_cls'] * float('nan')
        self.num_loss_calls += 1
        if self.macl_head is not None:
            macl = self.macl_head.loss((vis_feat, ), (ir_feat, ),
                                       data_samples)
            if (self.macl_fault and self.num_loss_calls > self.macl_fault_at
                    and self.macl_fault_rank in (None, get_rank())):
                if self.macl_fault == 'vanish':
                    macl = {}
                elif self.macl_fault == 'constant':
                    macl['loss_macl'] = torch.tensor(0.4)
                else:
                    macl['loss_macl'] = macl['loss_macl'].detach()
            if self.drop_macl_on_rank != get_rank():
                losses.update(macl)
        if self.double_count:
            losses['loss_total'] = losses['loss_cls'] + 0.5 * losses.get(
                'loss_macl', 0.)
        if self.grad_log_key:
            losses['macl_similarity'] = (vis_feat * ir_feat).mean()
        return losses


@METRICS.register_module()
class ToyAccuracy(BaseMetric):
    """Accuracy through MMEngine's gather-then-compute ``evaluate``."""

    default_prefix = 'toy'

    def process(self, data_batch, data_samples) -> None:
        for sample in data_samples:
            self.results.append(
                (float(int(sample['pred_label']) == int(sample['gt_label'])),
                 float(sample['gt_score'])))

    def compute_metrics(self, results) -> dict:
        if not results:
            return dict(acc=0.0, gt_score=0.0)
        acc, score = np.mean(np.array(results), axis=0)
        return dict(acc=float(acc), gt_score=float(score))


@METRICS.register_module()
class ShardOnlyAccuracy(ToyAccuracy):
    """The fault: computes on this rank's shard, never gathers."""

    def evaluate(self, size: int) -> dict:
        metrics = self.compute_metrics(self.results)
        self.results.clear()
        return {f'{self.prefix}/{k}': v for k, v in metrics.items()}

"""Fault-injecting toys for the step-safety tests (imported by the training
subprocess through ``custom_imports``).

Faults are tied to dataset indices, so they work in DataLoader workers and
land on a known rank and iteration: with ``InfiniteSampler(shuffle=False)``,
batch size ``B`` and 2 ranks, slot ``j`` of rank ``r``'s batch at iteration
``i`` is sample ``(r + 2 * (i * B + j)) % num_samples`` (see
``tests/engine/step_toys_runs.py::sample_index``).
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmdet.registry import DATASETS, HOOKS, MODELS
from mmdet.structures import DetDataSample
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import BaseModel, is_model_wrapper
from mmengine.structures import InstanceData
from torch.utils.data import Dataset

FAULTS = ('nan_loss', 'nan_grad', 'empty', 'zero_loss')


@DATASETS.register_module()
class StepToyDataset(Dataset):
    """Tiny detection-like samples: a 3x4x4 image and one box, or none.

    Args:
        num_samples (int): dataset length.
        faults (list[tuple[int, str]]): ``(index, kind)`` pairs; kind is
            ``'nan_loss'``, ``'nan_grad'``, ``'zero_loss'`` (read by
            :class:`StepToyDetector`) or ``'empty'`` (no GT instance).
    """

    def __init__(self, num_samples: int = 64,
                 faults: Sequence[Sequence] = ()) -> None:
        self.num_samples = num_samples
        self.faults: Dict[int, List[str]] = {}
        for index, kind in faults:
            assert kind in FAULTS, kind
            self.faults.setdefault(int(index), []).append(kind)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict:
        gen = torch.Generator().manual_seed(index)
        image = torch.rand(3, 4, 4, generator=gen)
        faults = self.faults.get(index, [])
        sample = DetDataSample(metainfo=dict(
            img_id=index, img_path=f'toy/vis/{index:04d}.png',
            ir_img_path=f'toy/ir/{index:04d}.png', faults=faults))
        gt = InstanceData()
        if 'empty' in faults:
            gt.bboxes = torch.zeros(0, 4)
            gt.labels = torch.zeros(0, dtype=torch.long)
        else:
            gt.bboxes = torch.rand(1, 4, generator=gen)
            gt.labels = torch.randint(0, 2, (1, ), generator=gen)
        sample.gt_instances = gt
        return dict(inputs=image, data_samples=sample)


@MODELS.register_module()
class StepToyDetector(BaseModel):
    """A detector-shaped toy whose loss drops ``loss_bbox`` (and with it the
    ``bbox_head`` parameters) when the batch has no GT: the parameters it
    leaves out of the graph would make DDP wait for their gradients."""

    def __init__(self, data_preprocessor: Optional[dict] = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.backbone = nn.Linear(48, 8)
        self.cls_head = nn.Linear(8, 2)
        self.bbox_head = nn.Linear(8, 4)

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        x = torch.stack(list(inputs)).flatten(1)
        feat = torch.relu(self.backbone(x))
        if mode != 'loss':
            return self.cls_head(feat)
        faults = [f for s in data_samples for f in s.metainfo['faults']]
        if 'nan_grad' in faults:
            # Finite loss, NaN gradient: poisons the backbone's gradients.
            feat.register_hook(lambda g: g * float('nan'))
        labels = torch.stack([
            s.gt_instances.labels[0] if len(s.gt_instances) else
            torch.tensor(0) for s in data_samples
        ])
        losses = dict(loss_cls=F.cross_entropy(self.cls_head(feat), labels))
        if 'nan_loss' in faults:
            losses['loss_cls'] = losses['loss_cls'] * float('nan')
        if 'zero_loss' in faults:
            # No signal at all: a loss that depends on every parameter but
            # is identically zero (gradient exactly 0).
            return dict(loss_cls=losses['loss_cls'] * 0.0,
                        loss_bbox=self.bbox_head(feat).sum() * 0.0)
        with_gt = [i for i, s in enumerate(data_samples)
                   if len(s.gt_instances)]
        if with_gt:
            target = torch.stack(
                [data_samples[i].gt_instances.bboxes[0] for i in with_gt])
            pred = self.bbox_head(feat[with_gt])
            losses['loss_bbox'] = F.l1_loss(pred, target)
        return losses


@HOOKS.register_module()
class StepDumpHook(Hook):
    """Saves, per rank, what the tests compare: parameters, a checksum and
    the loss keys of every iteration, the last iteration and the optim
    wrapper's counters, to ``{work_dir}/step_dump_rank{rank}.pt``."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.records: List[dict] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        checksum = sum(float(p.detach().double().abs().sum())
                       for p in model.parameters())
        self.records.append(
            dict(iter=runner.iter, checksum=checksum,
                 loss_keys=sorted(outputs or {})))

    def after_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        wrapper = runner.optim_wrapper
        torch.save(
            dict(state_dict={k: v.detach().clone()
                             for k, v in model.state_dict().items()},
                 param_names=[n for n, _ in model.named_parameters()],
                 records=self.records, last_iter=runner.iter,
                 counters=dict(getattr(wrapper, 'counters', {}) or {})),
            osp.join(runner.work_dir, f'step_dump_rank{get_rank()}.pt'))


@HOOKS.register_module()
class LrSpikeHook(Hook):
    """Multiplies every learning rate by ``factor`` for the iterations whose
    position in the run (counted by this hook, rolled-back iterations
    included) is in ``at``, or from ``at[0]`` on with ``lasting``: a
    schedule mistake that a rollback leaves behind, or one that stays.

    Its ``after_train_iter`` runs first, so the schedulers step the
    learning rate they would have stepped."""

    priority = 'VERY_HIGH'

    def __init__(self, at: Sequence[int] = (), factor: float = 1000.0,
                 lasting: bool = False) -> None:
        self.at = [int(i) for i in at]
        self.factor = float(factor)
        self.lasting = lasting
        self.executed = 0
        self._raised = False

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        hit = self.executed in self.at or (
            self.lasting and self.at and self.executed >= self.at[0])
        if hit:
            for group in runner.optim_wrapper.optimizer.param_groups:
                group['lr'] *= self.factor
        self._raised = hit

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        if self._raised:
            for group in runner.optim_wrapper.optimizer.param_groups:
                group['lr'] /= self.factor
        self._raised = False
        self.executed += 1

"""Components for the healthy-run identity and communication tests
(imported by the training subprocess through ``custom_imports``).

* :class:`ReferenceCpuAmpOptimWrapper`: MMEngine's ``AmpOptimWrapper``
  step (scale, backward, optional unscale + clip, ``scaler.step``,
  ``scaler.update``) with CPU autocast, the "guards off" side of the AMP
  comparisons (``AmpOptimWrapper`` itself refuses to run without a GPU);
  the dual-stream detector runs its RPN/RoI heads (mmcv's ops) in float32
  under it, as under ``AmpNaNSkipOptimWrapper``.
* :class:`CallCountHook`: counts, per training iteration, the Python-level
  ``torch.distributed`` collectives of the whole process and the host
  synchronisations (``.item()``, ``float(t)``, ...) made by mmsafe's guard
  code, with ``benchmarks/_common.py``'s counter, and writes them to
  ``{work_dir}/call_counts_rank{R}.json``.
"""
import json
import os.path as osp
from contextlib import contextmanager
from typing import List

import torch
from mmdet.registry import HOOKS, OPTIM_WRAPPERS
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapper

from benchmarks._common import CallCounter
from mmsafe.compat import grad_scaler


@OPTIM_WRAPPERS.register_module()
class ReferenceCpuAmpOptimWrapper(OptimWrapper):
    """``AmpOptimWrapper``'s arithmetic on CPU (no skip logic at all)."""

    def __init__(self, loss_scale='dynamic', dtype=None, **kwargs):
        super().__init__(**kwargs)
        self._scale_update_param = None
        if loss_scale == 'dynamic':
            self.loss_scaler = grad_scaler('cpu')
        elif isinstance(loss_scale, float):
            self._scale_update_param = loss_scale
            self.loss_scaler = grad_scaler('cpu', init_scale=loss_scale)
        else:
            self.loss_scaler = grad_scaler('cpu', **loss_scale)
        self.cast_dtype = getattr(torch, dtype) if isinstance(dtype,
                                                              str) else dtype

    def backward(self, loss, **kwargs):
        self.loss_scaler.scale(loss).backward(**kwargs)
        self._inner_count += 1

    def step(self, **kwargs):
        if self.clip_grad_kwargs:
            self.loss_scaler.unscale_(self.optimizer)
            self._clip_grad()
        self.loss_scaler.step(self.optimizer, **kwargs)
        self.loss_scaler.update(self._scale_update_param)

    @contextmanager
    def optim_context(self, model):
        with super().optim_context(model), torch.autocast(
                device_type='cpu', dtype=self.cast_dtype):
            yield


@HOOKS.register_module()
class CallCountHook(Hook):
    """Per-iteration counts of collectives and guard host syncs.

    With the lowest priority its ``after_train_iter`` runs last, so the
    counts between two of its calls cover one whole training iteration
    (every hook's ``before_train_iter`` and ``after_train_iter``, the
    forward, backward and optimizer step)."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.counter = CallCounter()
        self.records: List[dict] = []
        self._last = (0, 0)

    def before_train(self, runner) -> None:
        self.counter.install()

    def _totals(self):
        summary = self.counter.summary()
        return (summary['collectives']['total'],
                summary['syncs']['mmsafe'])

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        collectives, syncs = self._totals()
        self.records.append(
            dict(iter=runner.iter, collectives=collectives - self._last[0],
                 guard_syncs=syncs - self._last[1]))
        self._last = (collectives, syncs)

    def after_train(self, runner) -> None:
        summary = self.counter.summary()
        self.counter.remove()
        with open(osp.join(runner.work_dir,
                           f'call_counts_rank{get_rank()}.json'), 'w') as f:
            json.dump(dict(records=self.records,
                           sync_sites=summary['syncs']['mmsafe_sites']), f,
                      indent=1)

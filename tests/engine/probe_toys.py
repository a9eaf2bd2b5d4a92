"""Toy components and fault injectors for the DataLoaderProbeHook tests.
Configs load them with
``custom_imports=dict(imports=['mmsafe', 'tests.engine.probe_toys'])``."""
import json
import multiprocessing
import os.path as osp
import signal
import threading
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
from mmengine.dataset import BaseDataset
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from torch.utils.data import get_worker_info

from mmdet.registry import DATASETS, HOOKS, METRICS, MODELS, TRANSFORMS


@MODELS.register_module()
class ProbeToyModel(BaseModel):
    """A linear regressor on 4-vectors."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.linear = nn.Linear(4, 1)

    def forward(self, inputs, worker=None, payload=None, mode='tensor'):
        x = torch.stack(inputs).float()
        out = self.linear(x)
        if mode == 'loss':
            return dict(loss=(out - x.sum(1, keepdim=True)).pow(2).mean())
        if mode == 'predict':
            return [dict(pred=o) for o in out]
        return out


@METRICS.register_module()
class ProbeToyMetric(BaseMetric):
    """Counts the evaluated samples."""

    def process(self, data_batch, data_samples) -> None:
        self.results.append(len(data_samples))

    def compute_metrics(self, results) -> dict:
        return dict(count=float(sum(results)))


@TRANSFORMS.register_module()
class ProbeToVector:
    """Turns a data info into the sample the toy model reads."""

    def __call__(self, results: dict) -> dict:
        info = get_worker_info()
        return dict(
            inputs=torch.full((4, ), float(results['idx'])),
            worker=torch.tensor(-1 if info is None else info.id))


@TRANSFORMS.register_module()
class ProbeScaleWithLambda:
    """A user transform that keeps a lambda: fine in-process and with
    fork, impossible to send to a spawn-started worker."""

    def __init__(self, factor: float = 1.0):
        self.fn = lambda x: x * factor

    def __call__(self, results: dict) -> dict:
        results['inputs'] = self.fn(results['inputs'])
        return results


def _in_spawned_worker() -> bool:
    return get_worker_info() is not None and \
        multiprocessing.get_start_method(allow_none=True) == 'spawn'


@DATASETS.register_module()
class ProbeToyDataset(BaseDataset):
    """``length`` samples; optionally wedged in spawn-started workers.

    Args:
        length (int): number of samples.
        block_in_spawn_worker (bool): in a spawn-started worker process,
            ignore SIGTERM and block forever (the Windows deadlock: the
            main process waits without any message). In the main process
            (``num_workers=0``) samples load normally.
        paired (bool): data infos carry ``ir_img_path`` like mmsafe's
            paired datasets.
        raise_in_spawn_worker (bool): raise in spawn-started workers only
            (like a module that only the main process imported).
        raise_always (bool): raise everywhere (a bug in the data).
    """

    METAINFO = dict(classes=('thing', ))

    def __init__(self, length: int = 8, block_in_spawn_worker: bool = False,
                 paired: bool = False, raise_in_spawn_worker: bool = False,
                 raise_always: bool = False, **kwargs):
        self.length = length
        self.raise_in_spawn_worker = raise_in_spawn_worker
        self.raise_always = raise_always
        self.block_in_spawn_worker = block_in_spawn_worker
        self.paired = paired
        kwargs.setdefault('pipeline', [dict(type='ProbeToVector')])
        super().__init__(serialize_data=False, lazy_init=False, **kwargs)

    def load_data_list(self):
        infos = [dict(idx=i, img_path=f'vis/{i:04d}.jpg') for i in
                 range(self.length)]
        if self.paired:
            for info in infos:
                info['ir_img_path'] = info['img_path'].replace('vis', 'ir')
        return infos

    def prepare_data(self, idx):
        if self.block_in_spawn_worker and _in_spawned_worker():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            threading.Event().wait()
        if self.raise_always or (self.raise_in_spawn_worker
                                 and _in_spawned_worker()):
            raise KeyError(f'ProbeToyDataset: broken sample {idx}')
        return super().prepare_data(idx)


@DATASETS.register_module()
class ProbeBigSampleDataset(ProbeToyDataset):
    """Samples with a ``payload`` of ``sample_mb`` MiB (memory budget)."""

    def __init__(self, sample_mb: float = 1.0, **kwargs):
        self.sample_mb = sample_mb
        super().__init__(**kwargs)

    def prepare_data(self, idx):
        data = super().prepare_data(idx)
        data['payload'] = np.zeros(int(self.sample_mb * 2**20), np.uint8)
        return data


@HOOKS.register_module()
class RecordLoaderHook(Hook):
    """Records which loader objects the loops use and which worker
    delivered each batch, to ``{work_dir}/loader_record.json``."""

    priority = 'VERY_LOW'

    def __init__(self):
        self.record = dict(train_iters=[], val_iters=[])
        self._work_dir: Optional[str] = None

    def before_run(self, runner) -> None:
        self._work_dir = runner.work_dir
        # Before DataLoaderProbeHook's before_train: the original loader.
        self.record['train_loader_before'] = id(runner.train_loop.dataloader)

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        loader = runner.train_loop.dataloader
        self.record['train_iters'].append(
            dict(loader=id(loader), num_workers=loader.num_workers,
                 workers=[int(w) for w in data_batch['worker']]))
        self._dump()

    def after_val_iter(self, runner, batch_idx, data_batch=None,
                       outputs=None) -> None:
        loader = runner.val_loop.dataloader
        self.record['val_iters'].append(
            dict(loader=id(loader), num_workers=loader.num_workers,
                 workers=[int(w) for w in data_batch['worker']]))
        self._dump()

    def _dump(self) -> None:
        with open(osp.join(self._work_dir, 'loader_record.json'), 'w') as f:
            json.dump(self.record, f)

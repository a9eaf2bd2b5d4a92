"""Page faults of the LLVIP recipe's train pipeline (full-size decode) per
pair, with and without its ``KeepFreedMemory`` step, for tests/datasets/test_keep_freed_memory.py.

Run as a script in a fresh process (the allocator setting is process-wide
and stays, and forked workers inherit it): ``python -m
tests.datasets.memory_toys ROOT process`` runs the pipeline without the
step, then with it, in that process (in that order), and prints one JSON
line with the faults per pair of each and whether they gave the same
samples; ``ROOT fork`` / ``ROOT spawn`` run each in one DataLoader worker
started that way.
"""
import copy
import json
import os
import os.path as osp
import resource
import sys

import torch
from torch.utils.data import Dataset

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
BASE = osp.join(REPO, 'configs', '_base_', 'datasets', 'llvip.py')


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def recipe_dataset(root: str, keep: bool):
    """The LLVIP recipe's train dataset with a full-size decode (its
    ``KeepFreedMemory`` step kept or removed).

    The full decode, because its buffers (3.9 MB per image) are given back
    to the kernel by glibc on every machine measured (~1,950 faults per
    pair); whether the 1/2 decode's are depends on the OpenCV build
    (OpenCV 4.x: ~1,000 faults per pair, 5.0: none)."""
    import mmsafe  # noqa: F401  (registers)
    from mmdet.registry import DATASETS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    init_default_scope('mmsafe')
    pipeline = copy.deepcopy(Config.fromfile(BASE).train_pipeline)
    assert pipeline[-1]['type'] == 'KeepFreedMemory', pipeline
    pipeline[0]['reduced_decode'] = None
    if not keep:
        pipeline = pipeline[:-1]
    return DATASETS.build(dict(
        type='LLVIPDataset', data_root=root, filter_cfg=None,
        data_prefix=dict(img='visible/train/', ir_img='infrared/train/',
                         ann='Annotations/'), pipeline=pipeline))


class FaultsPerSample(Dataset):
    """``dataset[i]`` run in the loading process; returns the page faults
    that process took for it, and its pid."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        before = minor_faults()
        self.dataset[index]
        return minor_faults() - before, os.getpid()


def faults_per_pair(dataset, passes: int = 3) -> float:
    """Mean faults per pair over ``passes`` passes after a first one."""
    for i in range(len(dataset)):
        dataset[i]
    before = minor_faults()
    for _ in range(passes):
        for i in range(len(dataset)):
            dataset[i]
    return (minor_faults() - before) / (passes * len(dataset))


def samples(dataset, seed: int = 0) -> list:
    import numpy as np
    torch.manual_seed(seed)
    np.random.seed(seed)
    return [dataset[i] for i in range(len(dataset))]


def same_samples(a: list, b: list) -> bool:
    for x, y in zip(a, b):
        for key in ('visible', 'infrared'):
            if not torch.equal(x['inputs'][key], y['inputs'][key]):
                return False
        sx, sy = x['data_samples'], y['data_samples']
        if sx.metainfo.keys() != sy.metainfo.keys() or any(
                str(sx.metainfo[k]) != str(sy.metainfo[k])
                for k in sx.metainfo):
            return False
        if not torch.equal(sx.gt_instances.bboxes.tensor,
                           sy.gt_instances.bboxes.tensor):
            return False
    return len(a) == len(b)


def in_process(root: str) -> dict:
    """The pipeline run in this process (``num_workers=0``)."""
    import cv2
    cv2.setNumThreads(0)  # as in a DataLoader worker
    without, with_step = (recipe_dataset(root, keep) for keep in (False,
                                                                  True))
    result = dict(without=faults_per_pair(without))
    reference = samples(without)
    result['with'] = faults_per_pair(with_step)
    result['same_samples'] = same_samples(reference, samples(with_step))
    return result


def in_worker(root: str, context: str, epochs: int = 3) -> dict:
    """The pipeline run by one DataLoader worker started by ``context``
    (persistent), without the step and with it: faults per pair after the
    first epoch."""
    from torch.utils.data import DataLoader
    result = dict(main_pid=os.getpid())
    for keep in (False, True):
        loader = DataLoader(
            FaultsPerSample(recipe_dataset(root, keep)), batch_size=None,
            num_workers=1, persistent_workers=True,
            multiprocessing_context=context)
        faults, pids = [], set()
        for epoch in range(epochs):
            for count, pid in loader:
                pids.add(int(pid))
                if epoch:
                    faults.append(int(count))
        result['with' if keep else 'without'] = sum(faults) / len(faults)
        result[f'{"with" if keep else "without"}_pids'] = sorted(pids)
        del loader
    return result


if __name__ == '__main__':
    root, where = sys.argv[1], sys.argv[2]
    print(json.dumps(in_process(root) if where == 'process' else
                     in_worker(root, where)))

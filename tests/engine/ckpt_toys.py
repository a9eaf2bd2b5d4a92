"""Toy components and fault injectors for the checkpoint, resume and safety
report tests. Configs load them with
``custom_imports=dict(imports=['mmsafe', 'tests.engine.ckpt_toys'])``."""
import json
import os
import os.path as osp
import time
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from mmengine.dataset import BaseDataset
from mmengine.hooks import Hook
from mmengine.model import BaseModel

from mmdet.registry import DATASETS, HOOKS, MODELS

from mmsafe.events import update_counters, write_event


@MODELS.register_module()
class CkptToyRegressor(BaseModel):
    """A linear regressor; raises at ``crash_at_iter`` (0-based iteration of
    the whole run) on ``crash_rank`` (every rank when None) to simulate a
    crash."""

    def __init__(self, crash_at_iter: Optional[int] = None,
                 crash_rank: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        self.linear = nn.Linear(4, 1)
        self.crash_at_iter = crash_at_iter
        self.crash_rank = crash_rank

    def forward(self, inputs, data_samples=None, mode='tensor'):
        x = torch.stack(inputs) if isinstance(inputs, list) else inputs
        out = self.linear(x.float())
        if mode == 'loss':
            from mmengine.logging import MessageHub
            it = MessageHub.get_current_instance().get_info('iter')
            from mmengine.dist import get_rank
            if self.crash_at_iter is not None and it == self.crash_at_iter \
                    and self.crash_rank in (None, get_rank()):
                raise ValueError(f'toy crash at iteration {it}')
            return dict(loss=(out - x.sum(1, keepdim=True)).pow(2).mean())
        return out


@DATASETS.register_module()
class CkptToyDataset(BaseDataset):
    """``length`` fixed random 4-vectors."""

    METAINFO = dict(classes=('thing', ), palette=[(220, 20, 60)])

    def __init__(self, length: int = 8, **kwargs):
        self.length = length
        kwargs.setdefault('lazy_init', False)
        super().__init__(serialize_data=False, **kwargs)

    def load_data_list(self):
        rng = np.random.RandomState(0)
        return [dict(inputs=torch.from_numpy(rng.rand(4).astype(np.float32)))
                for _ in range(self.length)]

    def prepare_data(self, idx):
        return dict(inputs=self.get_data_info(idx)['inputs'])


@HOOKS.register_module()
class SlowCheckpointStorageHook(Hook):
    """Simulates slow storage (e.g. NFS) for checkpoint saves after
    ``after_saves`` completed saves: before each slow save's fsync it writes
    ``{work_dir}/slow_save_started`` and sleeps ``delay`` seconds, so a test
    can kill the process during the save."""

    def __init__(self, after_saves: int = 1, delay: float = 60.0):
        self.after_saves = after_saves
        self.delay = delay
        self.saves = 0

    def before_run(self, runner):
        real_fsync = os.fsync
        marker = osp.join(runner.work_dir, 'slow_save_started')

        def slow_fsync(fd):
            target = os.readlink(f'/proc/self/fd/{fd}') \
                if isinstance(fd, int) and osp.exists(f'/proc/self/fd/{fd}') \
                else ''
            if target.endswith('.mmsafe-tmp') and '.pth.' in target:
                self.saves += 1
                if self.saves > self.after_saves:
                    with open(marker, 'w') as f:
                        f.write(target)
                    time.sleep(self.delay)
            return real_fsync(fd)

        os.fsync = slow_fsync


@HOOKS.register_module()
class FakeGuardHook(Hook):
    """Publishes counters and events the way mmsafe guards do, so that the
    safety report can be checked against known numbers."""

    def __init__(self, skip_iters: Sequence[int] = (1, 3),
                 empty_iters_rank1: Sequence[int] = (2, )):
        self.skip_iters = list(skip_iters)
        self.empty_iters_rank1 = list(empty_iters_rank1)
        self.skipped = 0
        self.empty = 0

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        from mmengine.dist import get_rank
        it = runner.iter
        if it in self.skip_iters:
            self.skipped += 1
            cause = 'nan_loss' if it == self.skip_iters[0] else 'inf_grad'
            write_event(runner.work_dir, 'step_skip', iter=it,
                        reasons=[cause])
            update_counters('step_guard', skipped=self.skipped)
        if get_rank() == 1 and it in self.empty_iters_rank1:
            self.empty += 1
            write_event(runner.work_dir, 'empty_batch', iter=it,
                        files=['a.jpg'])
        update_counters('empty_batch', empty=self.empty)


def create_marker(path: str) -> str:
    """What a malicious checkpoint would call while being unpickled."""
    with open(path, 'w') as f:
        f.write('code ran')
    return path


class MarkerPayload:
    """Pickles as a call of :func:`create_marker` (``__reduce__``)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return create_marker, (self.path, )


class ExecPayload:
    """Pickles as ``exec(code)``: the classic malicious checkpoint."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return exec, (f'open({self.path!r}, "w").write("code ran")', )


class TrustedNote:
    """A harmless custom object some users keep in a checkpoint's meta."""

    def __init__(self, text: str = ''):
        self.text = text


@HOOKS.register_module()
class NoteInCheckpointHook(Hook):
    """Stores a :class:`TrustedNote` in every checkpoint's meta, as some
    projects do with their own objects."""

    def before_save_checkpoint(self, runner, checkpoint):
        checkpoint['meta']['note'] = TrustedNote(f'iter {runner.iter}')

    def after_load_checkpoint(self, runner, checkpoint):
        from mmsafe.events import log
        log(f"checkpoint note: {checkpoint['meta']['note'].text}")


def make_tiny_coco(root: str, num_images: int = 4, size: int = 64) -> str:
    """Write ``num_images`` tiny images with one box each and a COCO file;
    returns the annotation file path."""
    import cv2
    os.makedirs(osp.join(root, 'images'), exist_ok=True)
    rng = np.random.RandomState(0)
    images, annotations = [], []
    for i in range(num_images):
        img = (rng.rand(size, size, 3) * 60).astype(np.uint8)
        x, y, w, h = 8 + 4 * i, 10, 24, 30
        img[y:y + h, x:x + w] = 200
        name = f'{i:03d}.jpg'
        cv2.imwrite(osp.join(root, 'images', name), img)
        images.append(dict(id=i, file_name=name, width=size, height=size))
        annotations.append(dict(id=i, image_id=i, category_id=1,
                                bbox=[x, y, w, h], area=w * h, iscrowd=0))
    ann = osp.join(root, 'ann.json')
    with open(ann, 'w') as f:
        json.dump(dict(images=images, annotations=annotations,
                       categories=[dict(id=1, name='person')]), f)
    return ann

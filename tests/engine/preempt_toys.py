"""Components for the preemption tests (imported by the training
subprocess through ``custom_imports``).

* :class:`ProgressHook`: after each training iteration, writes the number
  of completed iterations to ``{work_dir}/progress_rank{R}`` (the test
  sends its signal when a chosen iteration is reached), optionally
  sleeping ``delay`` seconds so that a signal lands inside the run.
* :class:`SlowCheckpointHook`: pads every checkpoint that names
  ``preempted`` with ``pad_mb`` MiB of zeros and writes
  ``{work_dir}/saving`` first, so that a test can signal or kill the
  process while the checkpoint is written.
"""
import os
import os.path as osp
import time

import torch
from mmdet.registry import HOOKS
from mmengine.dist import get_rank
from mmengine.hooks import Hook


@HOOKS.register_module()
class ProgressHook(Hook):
    priority = 'VERY_LOW'

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        path = osp.join(runner.work_dir, f'progress_rank{get_rank()}')
        with open(path + '.tmp', 'w') as f:
            f.write(str(runner.iter + 1))
        os.replace(path + '.tmp', path)
        if self.delay:
            time.sleep(self.delay)


@HOOKS.register_module()
class SlowCheckpointHook(Hook):

    def __init__(self, pad_mb: int = 0, wait: float = 0.0) -> None:
        self.pad_mb = pad_mb
        self.wait = wait

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        if not checkpoint.get('meta', {}).get('mmsafe_resume'):
            return  # a regular checkpoint
        with open(osp.join(runner.work_dir, 'saving'), 'w') as f:
            f.write(str(os.getpid()))
        if self.wait:
            time.sleep(self.wait)
        if self.pad_mb:
            checkpoint['padding'] = torch.zeros(self.pad_mb * 2**18)

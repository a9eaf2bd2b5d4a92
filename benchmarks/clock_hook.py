"""A hook that writes wall-clock times of training events, so that a
benchmark can measure from the outside how long a guard took to react.
Configs load it with ``custom_imports=dict(imports=['mmsafe',
'benchmarks.clock_hook'])``."""
import json
import os
import os.path as osp
import time
from typing import List

from mmengine.dist import get_rank
from mmengine.hooks import Hook

from mmdet.registry import HOOKS


@HOOKS.register_module()
class BenchClockHook(Hook):
    """Appends ``[event, iteration, time.time()]`` to
    ``{work_dir}/clock_rank{R}.json`` at ``before_train`` (before any other
    hook: highest priority) and at every ``before_train_iter``. The file is
    rewritten at each record so that it survives an aborted run."""

    priority = 'HIGHEST'

    def __init__(self) -> None:
        self.records: List[list] = []

    def _record(self, runner, event: str) -> None:
        self.records.append([event, runner.iter, time.time()])
        path = osp.join(runner.work_dir, f'clock_rank{get_rank()}.json')
        with open(f'{path}.tmp', 'w') as f:
            json.dump(self.records, f)
        os.replace(f'{path}.tmp', path)

    def before_train(self, runner) -> None:
        self._record(runner, 'before_train')

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        self._record(runner, 'before_train_iter')

"""A training loop for benchmarks: MMEngine's ``IterBasedTrainLoop`` that
runs in blocks of iterations, each block started by a coordinator, and
records the wall time of every iteration (data fetch, hooks, forward,
backward, optimizer step, logging).

Two training processes (guards on, guards off) hold this loop; the
coordinator (``benchmarks/guard_overhead.py``) lets exactly one of them run
a block at a time, alternating, so that both see the same machine load and
neither competes with the other for the CPU. Gating is through files in
``gate_dir`` (polled every 5 ms outside the timed region): this also works
for ranks started by ``torch.distributed.run``, which do not inherit pipes.
"""
import json
import os
import os.path as osp
import time
from typing import Optional

import torch
from mmengine.dist import get_rank
from mmengine.runner import IterBasedTrainLoop

from mmdet.registry import LOOPS


def _wait_for(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not osp.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f'benchmark gate: no {path} after {timeout} s')
        time.sleep(0.005)


def _write_json(path: str, obj) -> None:
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        json.dump(obj, f)
    os.replace(tmp, path)


@LOOPS.register_module()
class GatedIterLoop(IterBasedTrainLoop):
    """``IterBasedTrainLoop`` in coordinator-started blocks.

    Args:
        runner: the runner.
        dataloader: the training dataloader (or its config).
        gate_dir (str): directory of the gate files.
        mode (str): name of this process group ('on' / 'off').
        block_iters (int): iterations per block.
        num_blocks (int): timed blocks.
        count_block (bool): run one more block with
            :class:`benchmarks._common.CallCounter` installed.
        profile_block (bool): run one more block (after the counting one)
            under cProfile and report the self time of mmsafe guard code.
        gate_timeout (float): seconds to wait for a block's start.
        **kwargs: the rest of ``IterBasedTrainLoop``'s arguments.
    """

    def __init__(self, runner, dataloader, gate_dir: str, mode: str,
                 block_iters: int, num_blocks: int, count_block: bool = True,
                 profile_block: bool = False, gate_timeout: float = 1800.,
                 **kwargs) -> None:
        self.num_timed_blocks = num_blocks + int(count_block) + int(
            profile_block)
        super().__init__(
            runner, dataloader,
            max_iters=block_iters * self.num_timed_blocks,
            val_interval=10**9, **kwargs)
        self.gate_dir = gate_dir
        self.mode = mode
        self.block_iters = block_iters
        self.count_block = count_block
        self.profile_block = profile_block
        self.gate_timeout = gate_timeout
        self.setup_started = time.perf_counter()

    def run(self) -> None:
        rank = get_rank()
        self.runner.call_hook('before_train')
        self.runner.call_hook('before_train_epoch')
        _write_json(
            osp.join(self.gate_dir, f'ready_{self.mode}_r{rank}.json'),
            dict(pid=os.getpid()))
        for block in range(self.num_timed_blocks):
            last = self.num_timed_blocks - 1
            profiling = self.profile_block and block == last
            counting = self.count_block and block == last - int(
                self.profile_block)
            _wait_for(osp.join(self.gate_dir, f'go_{self.mode}_{block}'),
                      self.gate_timeout)
            counter: Optional[object] = None
            if counting:
                from benchmarks._common import CallCounter
                counter = CallCounter()
                counter.install()
            profiler = None
            if profiling:
                import cProfile
                profiler = cProfile.Profile()
                profiler.enable()
            times = []
            sync_cuda = torch.cuda.is_available() and \
                torch.cuda.is_initialized()
            for _ in range(self.block_iters):
                start = time.perf_counter()
                self.runner.model.train()
                data_batch = next(self.dataloader_iterator)
                self.run_iter(data_batch)
                if sync_cuda:  # count queued GPU work in this iteration
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            result = dict(times=times, iter=self._iter)
            if profiler is not None:
                profiler.disable()
                from benchmarks._common import guard_profile
                result['profile'] = guard_profile(profiler)
                result['steps'] = self.block_iters
            if counter is not None:
                counter.remove()
                result['counts'] = counter.summary()
                result['steps'] = self.block_iters
            _write_json(
                osp.join(self.gate_dir,
                         f'done_{self.mode}_{block}_r{rank}.json'), result)
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        return self.runner.model

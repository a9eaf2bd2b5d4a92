"""``find_unused_parameters``, SyncBN and the backend suit the launcher.

Without a launcher MMEngine reverts SyncBN to BN (per-process statistics)
and never wraps the model in DDP, so those settings do nothing; with DDP on
CPU (gloo) SyncBN raises "SyncBatchNorm expected input tensor to be on GPU"
at the first forward pass. A ``torchrun`` without ``--launcher pytorch``
starts N independent single-process runs that all write the same work dir.
"""
import os
from typing import Any, Iterator, List

from ..context import PreflightContext
from ..report import CheckRow

NAME = 'distributed'


def _sync_bn_paths(node: Any, path: str) -> List[str]:
    found = []
    if isinstance(node, dict):
        if str(node.get('type', '')) in ('SyncBN', 'MMSyncBN',
                                         'SyncBatchNorm'):
            found.append(f'{path}.type')
        for key, value in node.items():
            found += _sync_bn_paths(value, f'{path}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            found += _sync_bn_paths(value, f'{path}[{i}]')
    return found


def check_distributed(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Check DDP-only settings against the launcher and the device."""
    import torch
    cfg = ctx.cfg
    cuda = torch.cuda.is_available()
    env_world = os.environ.get('WORLD_SIZE', '')
    if not ctx.distributed and env_world.isdigit() and int(env_world) > 1:
        yield CheckRow(
            'error', NAME, f'WORLD_SIZE={env_world} (torchrun) but launcher '
            'is none: every process would train alone on the full data and '
            'write the same work dir.', 'launcher',
            'Add --launcher pytorch to the tools/train.py command.')
    sync_paths = _sync_bn_paths(cfg.get('model', None), 'model')
    sync_bn = cfg.get('sync_bn', None)
    if sync_bn is not None and sync_bn not in ('torch', 'mmcv'):
        yield CheckRow('error', NAME, f'sync_bn={sync_bn!r}: MMEngine accepts '
                       "'torch' or 'mmcv'.", 'sync_bn',
                       "Use sync_bn='torch', or remove it.")
    if sync_paths or sync_bn is not None:
        where = sync_paths[0] if sync_paths else 'sync_bn'
        if not ctx.distributed:
            yield CheckRow(
                'warn', NAME, 'SyncBN is configured but the launcher is '
                'none: MMEngine reverts it to BN, so BatchNorm statistics '
                'come from this process\'s batch only.', where,
                "Use norm_cfg=dict(type='BN') for single-process runs, or "
                'launch with --launcher pytorch.')
        elif not cuda:
            yield CheckRow(
                'error', NAME, 'SyncBN with distributed training on CPU '
                '(gloo): torch raises "SyncBatchNorm expected input tensor to '
                'be on GPU" at the first forward pass.', where,
                "Use norm_cfg=dict(type='BN') (or 'GN') on CPU, and remove "
                'sync_bn.')
    model_wrapper = cfg.get('model_wrapper_cfg', None) or {}
    find_unused = model_wrapper.get(
        'find_unused_parameters', cfg.get('find_unused_parameters', False))
    if find_unused and not ctx.distributed:
        yield CheckRow(
            'info', NAME, 'find_unused_parameters=True has no effect without '
            'DDP (launcher none).', 'find_unused_parameters')
    elif find_unused:
        yield CheckRow(
            'info', NAME, 'find_unused_parameters=True: DDP traverses the '
            'graph every step (slower). It does not help when ranks use '
            'different parameters in one step; mmsafe\'s guards keep every '
            'parameter in the graph instead.', 'find_unused_parameters')
    backend = ((cfg.get('env_cfg', None) or {}).get('dist_cfg', None)
               or {}).get('backend', None)
    if ctx.distributed and not cuda and backend == 'nccl':
        yield CheckRow(
            'info', NAME, "dist_cfg.backend='nccl' on a machine without CUDA: "
            'mmsafe switches to gloo (logged once).',
            'env_cfg.dist_cfg.backend',
            "Set env_cfg.dist_cfg.backend='gloo' to silence it.")
    if ctx.distributed:
        yield CheckRow('ok', NAME, f'launcher {ctx.launcher}, world size '
                       f'{ctx.world_size} (from the environment), '
                       f'{"CUDA" if cuda else "CPU"}.', 'launcher')
    else:
        yield CheckRow('ok', NAME, 'Single process (launcher none).',
                       'launcher')

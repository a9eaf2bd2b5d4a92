"""Distributed training without CUDA (gloo on CPU).

Stock MMEngine 0.10 cannot start DDP on a CPU-only PyTorch: ``init_dist``
calls ``torch.cuda.set_device`` and ``Runner.wrap_model`` passes
``device_ids=[LOCAL_RANK]`` to DistributedDataParallel, which only accepts
``device_ids`` for GPU modules. With mmsafe imported,

    torchrun --nproc_per_node=2 tools/train.py CONFIG --launcher pytorch

works on a machine without a GPU: the process group uses gloo and the model
is wrapped without ``device_ids``. On a machine with CUDA nothing changes.
"""
import logging

import torch
import torch.distributed as torch_dist

_LOGGED = set()


def _log_once(key: str, message: str) -> None:
    if key in _LOGGED:
        return
    _LOGGED.add(key)
    from mmengine.logging import print_log
    print_log(message, logger='current', level=logging.WARNING)


def _cuda_usable() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def _cpu_backend(backend):
    if backend in (None, 'nccl'):
        _log_once(
            'gloo', f'[mmsafe] CUDA is not available: using the gloo backend '
            f'instead of {backend!r} for distributed training on CPU. Set '
            "env_cfg.dist_cfg.backend='gloo' to silence this message.")
        return 'gloo'
    return backend


def install_cpu_ddp_support() -> None:
    """Patch MMEngine so that DDP runs with gloo when CUDA is absent."""
    from mmengine.dist import utils as dist_utils
    from mmengine.model.wrappers import distributed as mm_ddp

    if getattr(dist_utils, '_mmsafe_cpu_ddp', False):
        return

    original_pytorch = dist_utils._init_dist_pytorch
    original_slurm = dist_utils._init_dist_slurm

    def _init_dist_pytorch(backend, init_backend='torch', **kwargs):
        if _cuda_usable() or init_backend != 'torch':
            return original_pytorch(backend, init_backend=init_backend,
                                    **kwargs)
        torch_dist.init_process_group(backend=_cpu_backend(backend), **kwargs)

    def _init_dist_slurm(backend, port=None, init_backend='torch', **kwargs):
        if _cuda_usable():
            return original_slurm(backend, port=port,
                                  init_backend=init_backend, **kwargs)
        # The slurm path derives MASTER_ADDR etc. itself and then calls
        # torch.cuda.set_device; on CPU that call is the only obstacle.
        saved = torch.cuda.set_device
        torch.cuda.set_device = lambda *args, **kw: None
        try:
            return original_slurm(_cpu_backend(backend), port=port,
                                  init_backend=init_backend, **kwargs)
        finally:
            torch.cuda.set_device = saved

    dist_utils._init_dist_pytorch = _init_dist_pytorch
    dist_utils._init_dist_slurm = _init_dist_slurm

    original_ddp_init = mm_ddp.MMDistributedDataParallel.__init__

    def ddp_init(self, module, detect_anomalous_params=False, **kwargs):
        if kwargs.get('device_ids') is not None:
            devices = {p.device.type for p in module.parameters()}
            if devices and devices <= {'cpu'}:
                # DDP accepts device_ids only for GPU modules.
                kwargs['device_ids'] = None
                kwargs.pop('output_device', None)
        original_ddp_init(self, module,
                          detect_anomalous_params=detect_anomalous_params,
                          **kwargs)

    mm_ddp.MMDistributedDataParallel.__init__ = ddp_init
    dist_utils._mmsafe_cpu_ddp = True

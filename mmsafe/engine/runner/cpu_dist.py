"""Starting DDP without CUDA: gloo on CPU, and a finite default timeout.

MMEngine 0.10's ``init_dist`` calls ``torch.cuda.set_device`` and
``Runner.wrap_model`` passes ``device_ids`` to DistributedDataParallel;
neither works on a CPU-only PyTorch. :class:`~mmsafe.engine.runner.
SafeRunner` starts the process group itself when CUDA is absent (before
MMEngine's ``setup_env``, which then finds it initialised) and wraps a CPU
model without ``device_ids``. With CUDA, MMEngine's own code runs.
"""
import os
import subprocess
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as torch_dist
from mmengine.device import get_device
from mmengine.dist import is_distributed
from mmengine.model import is_model_wrapper
from mmengine.registry import MODEL_WRAPPERS

from mmsafe.errors import MMSafeRuntimeError
from mmsafe.events import log, log_once

#: ``env_cfg.dist_cfg.timeout`` (seconds) of a distributed run whose config
#: sets none: a rank that waits for a dead or stalled peer fails instead of
#: waiting forever. Keep it above the hang watchdog's deadlines.
DEFAULT_DIST_TIMEOUT = 1800


def cuda_usable() -> bool:
    """Whether this process can use a CUDA device."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def with_default_timeout(dist_cfg: dict) -> dict:
    """``dist_cfg`` with :data:`DEFAULT_DIST_TIMEOUT` when it sets no
    timeout (logged); a config's own value always wins."""
    dist_cfg = dict(dist_cfg or {})
    if dist_cfg.get('timeout') is None:
        dist_cfg['timeout'] = DEFAULT_DIST_TIMEOUT
        log(f'distributed timeout: {DEFAULT_DIST_TIMEOUT:g} s (mmsafe '
            'default; set env_cfg.dist_cfg.timeout to change it).')
    return dist_cfg


def _cpu_backend(backend) -> str:
    if backend in (None, 'nccl'):
        log_once(
            'gloo', 'CUDA is not available: using the gloo backend '
            f'instead of {backend!r} for distributed training on CPU. Set '
            "env_cfg.dist_cfg.backend='gloo' to silence this message.")
        return 'gloo'
    return backend


def _slurm_env(port=None) -> None:
    """The environment variables torch's env:// rendezvous reads, from
    SLURM's (what MMEngine's slurm launcher sets, with SLURM's local id as
    the local rank instead of a GPU index)."""
    proc_id = int(os.environ['SLURM_PROCID'])
    node_list = os.environ['SLURM_NODELIST']
    if port is not None:
        os.environ['MASTER_PORT'] = str(port)
    os.environ.setdefault('MASTER_PORT', '29500')
    if 'MASTER_ADDR' not in os.environ:
        os.environ['MASTER_ADDR'] = subprocess.getoutput(
            f'scontrol show hostname {node_list} | head -n1')
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0')
    os.environ['RANK'] = str(proc_id)


def init_cpu_process_group(launcher: str, dist_cfg: dict) -> None:
    """Start the default process group on CPU (gloo).

    Args:
        launcher (str): ``'pytorch'`` (torchrun) or ``'slurm'``.
        dist_cfg (dict): ``env_cfg.dist_cfg``; ``timeout`` in seconds.

    Raises:
        RuntimeError: for a launcher MMEngine supports on GPUs only.
    """
    cfg = dict(dist_cfg)
    backend = _cpu_backend(cfg.pop('backend', None))
    if cfg.pop('init_backend', 'torch') != 'torch':
        raise MMSafeRuntimeError(
            '[mmsafe] distributed training on CPU supports '
            "env_cfg.dist_cfg.init_backend='torch' only.")
    timeout = cfg.pop('timeout', None)
    if timeout is not None:
        cfg['timeout'] = timedelta(seconds=timeout)
    port = cfg.pop('port', None)
    if launcher == 'slurm':
        _slurm_env(port)
    elif launcher != 'pytorch':
        raise MMSafeRuntimeError(
            f'[mmsafe] --launcher {launcher} needs CUDA in MMEngine. On a '
            'machine without a GPU use `torchrun --nproc_per_node=N '
            'tools/train.py CONFIG --launcher pytorch` (or slurm).')
    torch_dist.init_process_group(backend=backend, **cfg)


def env_cfg_or_default(env_cfg: Optional[dict]) -> dict:
    """``env_cfg``, or MMEngine's default when a config has none (MMEngine
    0.7's ``Runner.from_cfg`` passes the missing key as ``None``, which its
    ``Runner`` cannot take)."""
    return dict(dist_cfg=dict(backend='nccl')) if env_cfg is None \
        else env_cfg


def dist_env_cfg(env_cfg: Optional[dict], distributed: bool,
                 launcher: str) -> dict:
    """``env_cfg`` for MMEngine's ``setup_env``: a distributed run that has
    no process group yet gets a finite default timeout
    (:func:`with_default_timeout`), and without CUDA its process group is
    started here on gloo (MMEngine's ``setup_env`` then finds it
    initialised)."""
    env_cfg = env_cfg_or_default(env_cfg)
    if not distributed or is_distributed():
        return env_cfg
    env_cfg = dict(env_cfg)
    env_cfg['dist_cfg'] = with_default_timeout(env_cfg.get('dist_cfg'))
    if not cuda_usable():
        init_cpu_process_group(launcher, env_cfg['dist_cfg'])
    return env_cfg


def wraps_on_cpu(runner, model) -> bool:
    """Whether ``runner`` wraps ``model`` for DDP on CPU itself
    (:func:`cpu_ddp_wrapper_cfg`): a distributed run on CPU, a model not
    wrapped yet, no ``sync_bn`` (MMEngine's ``wrap_model`` does the rest)."""
    return (runner.distributed and not is_model_wrapper(model)
            and get_device() == 'cpu' and not runner.cfg.get('sync_bn'))


def cpu_ddp_wrapper_cfg(model_wrapper_cfg, cfg) -> dict:
    """The model wrapper config of a distributed run on CPU:
    ``MMDistributedDataParallel`` without ``device_ids`` (DDP takes none
    for a CPU module); a config's own ``model_wrapper_cfg`` as given, with
    that type when it names none.

    Args:
        model_wrapper_cfg (dict, optional): the runner's argument.
        cfg: the runner's config (``find_unused_parameters``).
    """
    wrapper = dict(model_wrapper_cfg or dict(
        broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False)))
    wrapper.setdefault('type', 'MMDistributedDataParallel')
    return wrapper


def wrap_on_cpu(model_wrapper_cfg, cfg, model: torch.nn.Module):
    """``model`` in the wrapper of :func:`cpu_ddp_wrapper_cfg` (for a run
    where :func:`wraps_on_cpu`)."""
    return MODEL_WRAPPERS.build(cpu_ddp_wrapper_cfg(model_wrapper_cfg, cfg),
                                default_args=dict(module=model))

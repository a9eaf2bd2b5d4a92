"""Memory that a DataLoader's batches in flight take.

Each of the ``local_processes()`` ranks of a machine runs ``num_workers``
workers that each keep ``prefetch_factor`` batches ready, so the batches in
flight take ``local ranks x num_workers x prefetch_factor x batch bytes``.
"""
import math
import os
import sys
from typing import Any, Optional

#: PyTorch's default ``prefetch_factor`` when workers are used
DEFAULT_PREFETCH = 2


def nbytes(obj: Any, _depth: int = 0) -> int:
    """Bytes of the tensors and arrays in a (collated) batch."""
    import torch
    if _depth > 8:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    np = sys.modules.get('numpy')
    if np is not None and isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, dict):
        return sum(nbytes(v, _depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v, _depth + 1) for v in obj)
    if hasattr(obj, '__dict__') and not callable(obj):
        return sum(nbytes(v, _depth + 1) for v in vars(obj).values())
    return 0


def available_memory() -> Optional[int]:
    """Available RAM in bytes (psutil, else /proc/meminfo), or None."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def local_processes(default: int = 1) -> int:
    """Training processes on this machine (``LOCAL_WORLD_SIZE`` set by
    torchrun, else ``default``)."""
    return max(1, int(os.environ.get('LOCAL_WORLD_SIZE', default) or 1))


def inflight_bytes(num_workers: int, prefetch_factor: Optional[int],
                   batch_bytes: int) -> int:
    """Bytes of the batches in flight on this machine."""
    prefetch = prefetch_factor or DEFAULT_PREFETCH
    return local_processes() * num_workers * prefetch * batch_bytes


def workers_that_fit(budget: int, prefetch_factor: Optional[int],
                     batch_bytes: int) -> int:
    """How many workers per rank keep the batches in flight within
    ``budget`` bytes (at least 1)."""
    per_worker = local_processes() * (prefetch_factor or DEFAULT_PREFETCH) \
        * batch_bytes
    return max(1, math.floor(budget / per_worker))


def budget_bytes(budget_mb: Optional[float], fraction: float) -> Optional[int]:
    """``budget_mb`` in bytes, else ``fraction`` of the available RAM (None
    when neither is known)."""
    if budget_mb is not None:
        return int(budget_mb * 2**20)
    available = available_memory()
    return None if available is None else int(available * fraction)

"""Feature detection for the PyTorch API that changed between 2.1 and now.

What differs, and what mmsafe does about it:

* ``torch.is_autocast_enabled(device)`` / ``torch.get_autocast_dtype(device)``
  take a device type on new torch; older torch has one function per device
  (``is_autocast_cpu_enabled``, ``get_autocast_cpu_dtype``, ...).
* ``torch.amp.GradScaler(device)`` exists on new torch; older torch has only
  ``torch.cuda.amp.GradScaler``, and no CPU kernels for the scaler's
  unscale/update: :class:`~mmsafe.compat.cpu_grad_scaler.CpuGradScaler`
  does the same arithmetic with ordinary tensor ops there.
* CPU autocast in float16: older torch supports bfloat16 only.
* ``torch.uint16`` and ``torch.uint32``: older torch has neither; numpy
  uint16/uint32 images become int32/int64 tensors, every value exact.
* Checkpoint loading (:mod:`mmsafe.checkpoint` reads checkpoints itself,
  the same way on every torch): the tensor dtypes (newer torch adds
  ``uint16``/``uint32``/float8 types), the storage classes that
  ``torch.save`` names, and numpy's pickling functions
  (``numpy.core.multiarray`` became ``numpy._core.multiarray`` in numpy 2).
* The rendezvous store of the default process group: reached through
  ``distributed_c10d._get_default_store()`` and its chain of
  ``PrefixStore.underlying_store``; a wait that times out raises
  ``RuntimeError`` on older torch and ``DistStoreError`` (a subclass) on
  newer torch.
* ``torch.optim.SGD(fused=True)`` (a fused CUDA step): newer torch only.
* Whether DDP finished the gradient reduction of the last backward:
  ``DistributedDataParallel._check_reducer_finalized()`` (raises DDP's own
  unused-parameter error when it did not).
"""
import functools
import warnings
from typing import Any, Dict, FrozenSet, Optional, Tuple

import numpy as np
import torch

from mmsafe.errors import MMSafeRuntimeError, MMSafeTypeError


# ------------------------------------------------------------ autocast --
def autocast_enabled(device_type: str) -> bool:
    """``torch.is_autocast_enabled(device_type)`` on every torch."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # the one-argument form is newer
        if device_type == 'cpu':
            return bool(torch.is_autocast_cpu_enabled())
        if device_type == 'cuda':
            return bool(torch.is_autocast_enabled())
        probe = getattr(torch, f'is_autocast_{device_type}_enabled', None)
        return bool(probe()) if probe is not None else False


def autocast_dtype(device_type: str) -> torch.dtype:
    """``torch.get_autocast_dtype(device_type)`` on every torch."""
    get = getattr(torch, 'get_autocast_dtype', None)
    if get is not None:
        return get(device_type)
    if device_type == 'cuda':
        return torch.get_autocast_gpu_dtype()
    return getattr(torch, f'get_autocast_{device_type}_dtype')()


@functools.lru_cache(maxsize=None)
def cpu_autocast_dtypes() -> Tuple[torch.dtype, ...]:
    """The dtypes that ``torch.autocast('cpu', dtype=...)`` accepts here
    (bfloat16 everywhere; float16 on newer torch)."""
    usable = []
    for dtype in (torch.bfloat16, torch.float16):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')
                with torch.autocast('cpu', dtype=dtype):
                    ok = autocast_enabled('cpu') and \
                        autocast_dtype('cpu') == dtype
        except RuntimeError:
            ok = False
        if ok:
            usable.append(dtype)
    return tuple(usable)


# ---------------------------------------------------------- GradScaler --
def grad_scaler(device_type: str, **kwargs: Any):
    """A GradScaler for ``device_type`` with torch's arguments
    (``init_scale``, ``growth_factor``, ``backoff_factor``,
    ``growth_interval``, ``enabled``).

    torch's own where it has one for that device (``torch.amp.GradScaler``;
    ``torch.cuda.amp.GradScaler`` before it), else
    :class:`~mmsafe.compat.cpu_grad_scaler.CpuGradScaler` for the CPU.
    """
    amp_scaler = getattr(torch.amp, 'GradScaler', None)
    if amp_scaler is not None:
        return amp_scaler(device_type, **kwargs)
    if device_type == 'cuda':
        return torch.cuda.amp.GradScaler(**kwargs)
    if device_type == 'cpu':
        from .cpu_grad_scaler import CpuGradScaler
        return CpuGradScaler(**kwargs)
    raise MMSafeRuntimeError(
        f'this torch ({torch.__version__}) has no GradScaler '
        f'for {device_type!r}')


# --------------------------------------------------------------- dtypes --
@functools.lru_cache(maxsize=None)
def supports_tensor_dtype(np_dtype: Any) -> bool:
    """Whether ``torch.from_numpy`` takes arrays of this numpy dtype."""
    try:
        torch.from_numpy(np.zeros(1, dtype=np_dtype))
    except TypeError:
        return False
    return True


_WIDER = {np.dtype(np.uint16): np.dtype(np.int32),
          np.dtype(np.uint32): np.dtype(np.int64)}


def numpy_to_tensor(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` for every dtype an image may have.

    A torch without ``uint16``/``uint32`` tensors gets the array widened to
    ``int32``/``int64``, which holds every value exactly; other dtypes are
    shared with the array as ``torch.from_numpy`` does.
    """
    if supports_tensor_dtype(array.dtype):
        return torch.from_numpy(array)
    wider = _WIDER.get(array.dtype)
    if wider is None:
        raise MMSafeTypeError(
            f'torch {torch.__version__} has no tensor type for '
            f'numpy {array.dtype} arrays')
    return torch.from_numpy(array.astype(wider))


# ---------------------------------------------------------- checkpoints --
@functools.lru_cache(maxsize=None)
def tensor_dtypes() -> Dict[str, torch.dtype]:
    """Every tensor dtype of this torch by the name a pickle gives it
    (``'torch.float32'``, and aliases such as ``'torch.float'``); newer
    torch has more (``torch.uint16``, float8 types)."""
    return {f'torch.{name}': value for name in dir(torch)
            for value in [getattr(torch, name, None)]
            if isinstance(value, torch.dtype)}


@functools.lru_cache(maxsize=None)
def plain_tensor_dtypes() -> FrozenSet[torch.dtype]:
    """The dtypes of ordinary tensors: those this torch fills with zeros
    (not the quantized ones, which need a quantizer)."""
    found = set()
    for dtype in tensor_dtypes().values():
        try:
            torch.zeros(1, dtype=dtype)
        except (RuntimeError, TypeError, NotImplementedError):
            continue
        found.add(dtype)
    return frozenset(found)


@functools.lru_cache(maxsize=None)
def storage_dtypes() -> Dict[str, torch.dtype]:
    """The storage classes that ``torch.save`` names in a checkpoint
    (``'torch.FloatStorage'`` ...; ``torch.UntypedStorage`` holds bytes),
    with the dtype of each: the legacy typed storage classes this torch
    still has, for the dtypes of which it makes ordinary (not quantized)
    tensors."""
    found: Dict[str, torch.dtype] = {}
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # TypedStorage is deprecated
        for name in dir(torch):
            value = getattr(torch, name, None)
            if not (isinstance(value, type) and name.endswith('Storage')
                    and issubclass(value, torch.TypedStorage)
                    and value is not torch.TypedStorage):
                continue
            dtype = getattr(value, 'dtype', None)
            if isinstance(dtype, torch.dtype) and \
                    dtype in plain_tensor_dtypes():
                found[f'torch.{name}'] = dtype
    untyped = torch.UntypedStorage
    for module in ('torch', untyped.__module__):
        found[f'{module}.UntypedStorage'] = torch.uint8
    return found


@functools.lru_cache(maxsize=None)
def numpy_pickle_functions() -> Dict[str, Any]:
    """The functions by which numpy pickles arrays and scalars, by the
    dotted names pickles give them: ``numpy.core.*`` under numpy 1,
    ``numpy._core.*`` under numpy 2 (a checkpoint may come from either;
    both names resolve to this numpy's function). ``_reconstruct`` and
    ``scalar`` (protocols 2-4), ``_frombuffer`` (arrays under protocol
    5)."""
    try:
        from numpy._core import multiarray, numeric  # numpy >= 2
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray, numeric  # type: ignore
    found = {}
    for package in ('numpy.core', 'numpy._core'):
        found[f'{package}.multiarray._reconstruct'] = multiarray._reconstruct
        found[f'{package}.multiarray.scalar'] = multiarray.scalar
        found[f'{package}.numeric._frombuffer'] = numeric._frombuffer
    return found


# -------------------------------------------------- rendezvous store --
def default_store_address() -> Optional[Tuple[str, int]]:
    """``(host, port)`` of the TCP store behind the default process group,
    or None when there is none (no process group, or a file or hash
    store).

    Under ``torchrun`` this is its agent's store, otherwise the store that
    rank 0 serves (``MASTER_ADDR:MASTER_PORT``).
    """
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed import distributed_c10d
    get_store = getattr(distributed_c10d, '_get_default_store', None)
    store = get_store() if get_store is not None else None
    seen = 0
    while store is not None and hasattr(store, 'underlying_store') \
            and seen < 16:
        store = store.underlying_store
        seen += 1
    tcp_store = getattr(dist, 'TCPStore', None)
    if tcp_store is None or not isinstance(store, tcp_store):
        return None
    host, port = getattr(store, 'host', None), getattr(store, 'port', None)
    if not host or not port:
        return None
    return str(host), int(port)


# ------------------------------------------------------------ optimizer --
def sgd_has_fused() -> bool:
    """Whether this torch's ``torch.optim.SGD`` takes ``fused=True``."""
    import inspect
    return 'fused' in inspect.signature(torch.optim.SGD).parameters


# ------------------------------------------------------------------ DDP --
def ddp_reduction_check(model: Any):
    """A callable that raises DDP's unused-parameter error when ``model``'s
    last backward left its gradient reduction unfinished (a local check,
    no communication), or None when ``model`` is not DDP or this torch has
    no such check."""
    from torch.nn.parallel import DistributedDataParallel
    if not isinstance(model, DistributedDataParallel):
        return None
    check = getattr(model, '_check_reducer_finalized', None)
    return check if callable(check) else None

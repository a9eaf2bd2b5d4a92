"""Tensors, storages and the other torch objects of a checkpoint.

``torch.save`` pickles a tensor as ``torch._utils._rebuild_tensor_v2(
storage, offset, size, stride, requires_grad, backward_hooks)`` whose
storage is a persistent id ``('storage', <storage class>, key, location,
numel)`` naming the record ``data/<key>``. :class:`TorchObjects` rebuilds
them without torch's loader:

* a persistent id must name a record of the file whose size is exactly
  ``numel`` times the element size of its class; a key named twice names
  the same class and size;
* a tensor is a view of such a storage: integer offset, sizes and strides
  (at most :data:`MAX_DIMS`), every element inside the storage;
  ``requires_grad`` only for floating point and complex dtypes; no
  backward hooks and no tensor metadata;
* the storage goes where ``map_location`` says, as ``torch.load`` does
  (None, a device string or ``torch.device``, a dict of locations, or a
  callable ``(storage, location)``);
* ``_rebuild_tensor`` (older torch: no ``requires_grad``, no hooks) and
  ``_rebuild_tensor_v3`` (newer torch: dtypes without a storage class);
* ``torch.nn.Parameter`` (``_rebuild_parameter``), ``torch.device``,
  ``torch.Size`` and the dtypes (``torch.float32`` ...) are the other
  torch objects of checkpoints.
"""
import collections
import functools
import re
from typing import Any, Dict, Optional

import torch
from torch.serialization import default_restore_location

from mmsafe.compat import plain_tensor_dtypes, storage_dtypes, tensor_dtypes
from mmsafe.errors import MMSafeTypeError
from .container import CheckpointArchive
from .errors import CheckpointFormatError
from .tokens import (Token, describe, exact_bool, exact_int, expect_args,
                     refuse)

MAX_DIMS = 64
#: the storage locations torch.save writes
LOCATION = re.compile(r'(cpu|meta|mps|(cuda|xpu|hpu|privateuseone)'
                      r'(:[0-9]{1,4})?)$')
#: device types a pickled torch.device may name
DEVICE_TYPES = frozenset({'cpu', 'cuda', 'meta', 'mps', 'xpu', 'hpu',
                          'privateuseone'})


@functools.lru_cache(maxsize=None)
def element_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


class StorageRef:
    """A storage record of the file, as a persistent id names it, loaded
    and placed where ``map_location`` says."""

    __slots__ = ('key', 'dtype', 'numel', 'location', 'storage')

    def __init__(self, key: str, dtype: torch.dtype, numel: int,
                 location: str, storage: torch.UntypedStorage):
        self.key, self.dtype, self.numel = key, dtype, numel
        self.location, self.storage = location, storage


def _restore(storage: torch.UntypedStorage, location: str,
             map_location: Any) -> torch.UntypedStorage:
    """Where ``torch.load`` would put ``storage`` for ``map_location``."""
    if map_location is None:
        moved = default_restore_location(storage, location)
    elif isinstance(map_location, dict):
        moved = default_restore_location(
            storage, str(map_location.get(location, location)))
    elif isinstance(map_location, (str, bytes)):
        target = map_location.decode() if isinstance(map_location, bytes) \
            else map_location
        moved = default_restore_location(storage, target)
    elif isinstance(map_location, torch.device):
        moved = default_restore_location(storage, str(map_location))
    elif callable(map_location):
        moved = map_location(storage, location)
        if moved is None:
            moved = default_restore_location(storage, location)
    else:
        raise MMSafeTypeError(
            f'map_location must be None, a str, a torch.device, '
            f'a dict or a callable, not '
            f'{type(map_location).__name__}')
    if isinstance(moved, torch.TypedStorage):
        moved = moved.untyped()
    if not isinstance(moved, torch.UntypedStorage) or \
            moved.nbytes() != storage.nbytes():
        raise MMSafeTypeError(f'map_location turned a storage of '
                              f'{storage.nbytes()} bytes into {type(moved)!r}')
    return moved


def _shape(value: Any, what: str) -> tuple:
    if type(value) is not tuple or len(value) > MAX_DIMS:
        raise refuse(f'{what} must be a tuple of at most {MAX_DIMS} '
                     f'integers, not {type(value).__qualname__}')
    return tuple(exact_int(v, what) for v in value)


def _no_hooks(hooks: Any) -> None:
    if type(hooks) not in (dict, collections.OrderedDict) or hooks:
        raise refuse('a tensor with backward hooks: torch.save writes an '
                     'empty OrderedDict there, and a hook would run code at '
                     'backward()')


def _grad_flag(value: Any, dtype: torch.dtype) -> bool:
    flag = exact_bool(value, 'requires_grad')
    if flag and not (dtype.is_floating_point or dtype.is_complex):
        raise refuse(f'requires_grad=True on a {dtype} tensor')
    return flag


class TorchObjects:
    """The torch part of the checkpoint allowlist, for one load.

    Args:
        archive (CheckpointArchive): the file's checked records.
        map_location: as ``torch.load``'s.
    """

    def __init__(self, archive: CheckpointArchive, map_location: Any):
        self.archive = archive
        self.map_location = map_location
        self.refs: Dict[str, StorageRef] = {}

    def globals(self) -> Dict[str, Any]:
        """Dotted name -> token or value."""
        found: Dict[str, Any] = dict(tensor_dtypes())
        for name, dtype in storage_dtypes().items():
            found[name] = Token(name, dtype=dtype)
        for name, call in (
                ('torch._utils._rebuild_tensor', self.rebuild_tensor),
                ('torch._utils._rebuild_tensor_v2', self.rebuild_tensor_v2),
                ('torch._utils._rebuild_tensor_v3', self.rebuild_tensor_v3),
                ('torch._utils._rebuild_parameter', self.rebuild_parameter),
                ('torch.device', self.device), ('torch.Size', self.size)):
            found[name] = Token(name, call=call)
        return found

    # ------------------------------------------------------- storages --
    def persistent_load(self, pid: Any) -> StorageRef:
        if type(pid) is not tuple or len(pid) != 5 or \
                type(pid[0]) is not str or pid[0] != 'storage':
            raise refuse('a persistent id other than (\'storage\', class, '
                         f'key, location, size): {describe(pid)}')
        _, kind, key, location, numel = pid
        if not isinstance(kind, Token) or kind.dtype is None:
            raise refuse(f'a storage of class {describe(kind)}, not a storage '
                         'class '
                         'of plain tensors')
        if type(location) is not str or not LOCATION.match(location):
            raise refuse(f'a storage at location {describe(location)}')
        numel = exact_int(numel, 'a storage size')
        sizes = self.archive.storage_sizes
        if type(key) is not str or key not in sizes:
            raise CheckpointFormatError(
                f'its pickle names the storage {describe(key)}, which has '
                'no data/ record')
        nbytes = numel * element_size(kind.dtype)
        if nbytes != sizes[key]:
            raise CheckpointFormatError(
                f'its pickle says storage {key} holds {numel} {kind.dtype} '
                f'elements ({nbytes} bytes), but its record data/{key} has '
                f'{sizes[key]} bytes')
        ref = self.refs.get(key)
        if ref is not None:
            if (ref.dtype, ref.numel, ref.location) != (kind.dtype, numel,
                                                        location):
                raise CheckpointFormatError(
                    f'its pickle names storage {key} twice, with different '
                    'classes or locations')
            return ref
        storage = _restore(self.archive.storage(key), location,
                           self.map_location)
        ref = StorageRef(key, kind.dtype, numel, location, storage)
        self.refs[key] = ref
        return ref

    def unused_records(self) -> list:
        """Storage records that no persistent id named."""
        return sorted(set(self.archive.storage_sizes) - set(self.refs))

    # -------------------------------------------------------- tensors --
    def rebuild_tensor(self, args: tuple) -> torch.Tensor:
        """Older torch: ``_rebuild_tensor(storage, offset, size, stride)``."""
        expect_args('torch._utils._rebuild_tensor', args, 4)
        ref = args[0]
        dtype = ref.dtype if isinstance(ref, StorageRef) else None
        return self._tensor(ref, dtype, *args[1:4], False, {}, None)

    def rebuild_tensor_v2(self, args: tuple) -> torch.Tensor:
        expect_args('torch._utils._rebuild_tensor_v2', args, 6, 7)
        ref = args[0]
        dtype = ref.dtype if isinstance(ref, StorageRef) else None
        return self._tensor(ref, dtype, *args[1:6],
                            args[6] if len(args) == 7 else None)

    def rebuild_tensor_v3(self, args: tuple) -> torch.Tensor:
        """Newer torch: dtypes without a storage class (``uint16`` ...)
        have an untyped storage and the dtype as the 7th argument."""
        expect_args('torch._utils._rebuild_tensor_v3', args, 7, 8)
        dtype = args[6]
        if not isinstance(dtype, torch.dtype) or \
                dtype not in plain_tensor_dtypes():
            raise refuse(f'_rebuild_tensor_v3 with dtype {describe(dtype)}')
        return self._tensor(args[0], dtype, *args[1:6],
                            args[7] if len(args) == 8 else None)

    def _tensor(self, ref: Any, dtype: Optional[torch.dtype], offset: Any,
                size: Any, stride: Any, requires_grad: Any, hooks: Any,
                metadata: Any) -> torch.Tensor:
        if not isinstance(ref, StorageRef):
            raise refuse('a tensor whose storage is not a storage record of '
                         'the file')
        if ref.dtype != dtype and ref.dtype != torch.uint8:
            raise refuse(f'a {dtype} tensor on a {ref.dtype} storage')
        try:
            itemsize = element_size(dtype)
        except (RuntimeError, TypeError) as err:
            raise refuse(f'a tensor of dtype {dtype}, which this torch '
                         'cannot make') from err
        nbytes = ref.numel * element_size(ref.dtype)
        if nbytes % itemsize:
            raise CheckpointFormatError(
                f'storage {ref.key} of {nbytes} bytes holds no whole number '
                f'of {dtype} elements')
        capacity = nbytes // itemsize
        offset = exact_int(offset, 'a tensor offset')
        size = _shape(size, 'a tensor size')
        stride = _shape(stride, 'a tensor stride')
        if len(size) != len(stride):
            raise refuse(f'a tensor of {len(size)} sizes and {len(stride)} '
                         'strides')
        if all(size):
            last = offset + sum((n - 1) * s for n, s in zip(size, stride))
            if last >= capacity:
                raise CheckpointFormatError(
                    f'a tensor view of storage {ref.key} reaches element '
                    f'{last}, past its {capacity} elements')
        elif offset > capacity:
            raise CheckpointFormatError(
                f'a tensor offset {offset} past the {capacity} elements of '
                f'storage {ref.key}')
        grad = _grad_flag(requires_grad, dtype)
        _no_hooks(hooks)
        if metadata is not None and (type(metadata) is not dict or metadata):
            raise refuse('a tensor with metadata (conjugate or negative '
                         'bits): re-save it with .resolve_conj() and '
                         '.resolve_neg()')
        tensor = torch.empty(0, dtype=dtype, device=ref.storage.device)
        tensor.set_(ref.storage, offset, size, stride)
        if grad:
            tensor.requires_grad_(True)
        return tensor

    def rebuild_parameter(self, args: tuple) -> torch.nn.Parameter:
        expect_args('torch._utils._rebuild_parameter', args, 3)
        data, requires_grad, hooks = args
        if type(data) is not torch.Tensor:
            raise refuse('a Parameter of something other than a tensor')
        grad = _grad_flag(requires_grad, data.dtype)
        _no_hooks(hooks)
        return torch.nn.Parameter(data, grad)

    # ----------------------------------------------------------- other --
    def device(self, args: tuple) -> torch.device:
        expect_args('torch.device', args, 1, 2)
        kind = args[0]
        if type(kind) is not str or kind.split(':')[0] not in DEVICE_TYPES \
                or not LOCATION.match(kind):
            raise refuse(f'torch.device of {describe(kind)}')
        if len(args) == 2:
            exact_int(args[1], 'a device index', high=65535)
        try:
            return torch.device(*args)
        except (RuntimeError, TypeError, ValueError) as err:
            raise refuse(f'torch.device{describe(args)}: {err}') from err

    def size(self, args: tuple) -> torch.Size:
        expect_args('torch.Size', args, 1)
        return torch.Size(_shape(args[0], 'torch.Size'))

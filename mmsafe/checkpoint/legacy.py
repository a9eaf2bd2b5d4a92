"""Reading torch's legacy (non-zip) format as plain data, for the one-off
conversion of an old checkpoint (:mod:`.convert`); training never reads
this format (:class:`~.container.CheckpointArchive` refuses it).

torch < 1.6 (and ``torch.save(..., _use_new_zipfile_serialization=False)``)
writes one file of consecutive pickles and raw bytes::

    pickle  the magic number 0x1950a86a20f9469cfc6c
    pickle  the protocol version 1001
    pickle  {'protocol_version': 1001, 'little_endian': True,
             'type_sizes': {...}}
    pickle  the saved object; each storage as the persistent id
            ('storage', <storage class>, key, location, numel, None)
    pickle  the list of storage keys, in the order of their bytes
    then, per key: numel (int64, little-endian), numel * element size bytes

:func:`load_legacy_checkpoint` reads it with the same unpickler, allowlist
and plain-data check as every other load: nothing of the file runs. Each
storage's declared size must fit in what the file has left before it is
allocated; every storage the pickle names must come with its bytes, and
the file must end with the last of them. Storage views of torch < 1.0
(a persistent id with view metadata) and the ``'module'`` persistent ids
of pickled modules are refused.
"""
import os
from typing import Any, List

import torch

from .allowlist import CheckpointRules
from .container import LEGACY_MAGIC
from .errors import CheckpointFormatError
from .plain_data import check_plain_data, node_budget
from .tensors import LOCATION, StorageRef, TorchObjects, element_size
from .tokens import Token, describe, exact_int, refuse
from .unpickler import CheckpointUnpickler

MAGIC_NUMBER = int.from_bytes(LEGACY_MAGIC, 'little')
PROTOCOL_VERSION = 1001


class _LegacyStorages(TorchObjects):
    """Storages of the legacy format: allocated when the pickle names them
    (their bytes follow the pickle), within what the file holds."""

    def __init__(self, budget: int):
        super().__init__(None, 'cpu')
        self.budget = budget

    def persistent_load(self, pid: Any) -> StorageRef:
        if type(pid) is not tuple or len(pid) != 6 or \
                type(pid[0]) is not str or pid[0] != 'storage':
            raise refuse('a persistent id other than (\'storage\', class, '
                         f'key, location, size, None): {describe(pid)}')
        _, kind, key, location, numel, view = pid
        if view is not None:
            raise refuse('a storage view (the format of torch < 1.0)')
        if not isinstance(kind, Token) or kind.dtype is None:
            raise refuse(f'a storage of class {describe(kind)}')
        if type(key) is not str or len(key) > 40:
            raise refuse('a storage key that is not a short string')
        if type(location) is not str or not LOCATION.match(location):
            raise refuse(f'a storage at location {describe(location)}')
        numel = exact_int(numel, 'a storage size')
        ref = self.refs.get(key)
        if ref is not None:
            if (ref.dtype, ref.numel) != (kind.dtype, numel):
                raise CheckpointFormatError(
                    f'its pickle names storage {key} twice, with different '
                    'classes or sizes')
            return ref
        nbytes = numel * element_size(kind.dtype)
        if nbytes > self.budget:
            raise CheckpointFormatError(
                f'its pickle says storage {key} holds {nbytes} bytes, more '
                'than the file has')
        self.budget -= nbytes
        ref = StorageRef(key, kind.dtype, numel, location,
                         torch.UntypedStorage(nbytes))
        self.refs[key] = ref
        return ref

    def unused_records(self) -> list:
        return []


def _plain_rules() -> CheckpointRules:
    """Rules for the small pickles around the object (numbers, a dict, a
    list of keys)."""
    return CheckpointRules(None, 'cpu', {}, torch_objects=_LegacyStorages(0))


def load_legacy_checkpoint(path: str) -> Any:
    """The object saved in torch's legacy format at ``path``, as plain
    data, on CPU.

    Raises:
        CheckpointFormatError: not that format, or inconsistent.
        UntrustedCheckpointError: it holds something other than plain data.
    """
    with open(path, 'rb') as f:
        data = f.read()
    pos = 0
    header: List[Any] = []
    for _ in range(3):
        reader = CheckpointUnpickler(data, _plain_rules(), pos, to_end=False)
        header.append(reader.load())
        pos = reader.pos
    magic, version, info = header
    if magic != MAGIC_NUMBER or version != PROTOCOL_VERSION:
        raise CheckpointFormatError(f'{path} is not in torch\'s legacy '
                                    'format (magic number or version)')
    if type(info) is not dict or info.get('little_endian') is not True:
        raise CheckpointFormatError(f'{path} was saved on a big-endian '
                                    'machine')
    storages = _LegacyStorages(len(data) - pos)
    rules = CheckpointRules(None, 'cpu', {}, torch_objects=storages)
    reader = CheckpointUnpickler(data, rules, pos, to_end=False)
    result = reader.load()
    keys_reader = CheckpointUnpickler(data, _plain_rules(), reader.pos,
                                      to_end=False)
    keys = keys_reader.load()
    pos = keys_reader.pos
    if type(keys) is not list or not all(type(k) is str for k in keys) \
            or sorted(keys) != sorted(storages.refs):
        raise CheckpointFormatError(
            f'{path}: its list of storages does not match its pickle')
    for key in keys:
        pos = _fill(data, pos, storages.refs[key], path)
    if pos != len(data):
        raise CheckpointFormatError(f'{path}: {len(data) - pos} bytes follow '
                                    'its last storage')
    check_plain_data(result, node_budget(reader.pos),
                     history_types=(rules.history.cls, ), built=rules.built)
    return result


def _fill(data: bytes, pos: int, ref: StorageRef, path: str) -> int:
    """Copy the bytes of ``ref``'s storage from ``data`` at ``pos``."""
    count = int.from_bytes(data[pos:pos + 8], 'little', signed=True)
    nbytes = ref.numel * element_size(ref.dtype)
    end = pos + 8 + nbytes
    if count != ref.numel or end > len(data):
        raise CheckpointFormatError(
            f'{path}: storage {ref.key} has {count} elements in the file, '
            f'{ref.numel} in its pickle (or is cut short)')
    if nbytes:
        target = torch.empty(0, dtype=torch.uint8).set_(ref.storage)
        target.copy_(torch.frombuffer(bytearray(data[pos + 8:end]),
                                      dtype=torch.uint8))
    return end


def is_legacy_file(path: str) -> bool:
    """Whether ``path`` is a regular file that starts like torch's legacy
    format."""
    if not os.path.isfile(path):
        return False
    with open(path, 'rb') as f:
        return LEGACY_MAGIC in f.read(32)

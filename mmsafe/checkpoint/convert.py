"""Converting an old checkpoint once, deliberately, outside training.

Training reads only the zip archive of a plain ``torch.save``
(:mod:`.loader`). :func:`convert_checkpoint` turns what can be converted
without running anything of the file into that format:

* torch's legacy (non-zip) format of torch < 1.6, which many published
  model zoo files still have: read as plain data by
  :func:`load_legacy_checkpoint` (below: the same unpickler, allowlist and
  checks as training; nothing of the file runs), written with
  ``torch.save``, then loaded back with mmsafe's loader;
* a file that already loads is left alone.

A tar file (torch's oldest format) and a TorchScript archive hold files to
extract or code to run: no tool converts them without trusting them. The
error says what to do: load the file with the torch that wrote it in an
isolated, throwaway environment (a container without network, credentials
or your data), save its ``state_dict()`` with ``torch.save``, and check the
result here (:func:`check_checkpoint`).

The legacy format (torch < 1.6, and ``torch.save(...,
_use_new_zipfile_serialization=False)``; training never reads it:
:class:`~.container.CheckpointArchive` refuses it) is one file of
consecutive pickles and raw bytes::

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
import os.path as osp
import stat
from typing import Any, List, Tuple

import torch

from mmsafe.errors import MMSafeFileExistsError
from .allowlist import CheckpointRules
from .atomic import atomic_write
from .container import LEGACY_MAGIC, CheckpointArchive, describe_non_zip
from .errors import CheckpointFormatError
from .loader import load_checkpoint_file
from .plain_data import check_plain_data, node_budget
from .tensors import LOCATION, StorageRef, TorchObjects, element_size
from .tokens import Token, describe, exact_int, refuse
from .unpickler import CheckpointUnpickler

ISOLATED_HINT = (
    'No tool converts it without trusting it. If you must use it: in an '
    'isolated, throwaway environment (a container without network, '
    'credentials or your data) with the torch that wrote it, load it and '
    'save only its weights, e.g. `torch.save(torch.jit.load(f).state_dict()'
    ', out)` for TorchScript; then check the new file with `python '
    'tools/convert_checkpoint.py --check out.pth`.')
#: the first two pickles of a legacy file
MAGIC_NUMBER = int.from_bytes(LEGACY_MAGIC, 'little')
PROTOCOL_VERSION = 1001


def _head(path: str) -> bytes:
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointFormatError(f'{path} is not a regular file',
                                    filename=path)
    with open(path, 'rb') as f:
        return f.read(512)


def summarize(obj: Any) -> str:
    """A one-line account of a loaded checkpoint: its top-level keys and
    how many tensors and bytes it holds."""
    tensors, nbytes = 0, 0
    todo, seen = [obj], set()
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            tensors += 1
            nbytes += item.numel() * item.element_size()
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    keys = list(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
    return (f'{tensors} tensors, {nbytes / 2**20:.1f} MiB of tensor data; '
            f'top-level keys: {keys}')


def check_checkpoint(path: str) -> str:
    """Load ``path`` as training does, after checking the CRC of every
    record; its :func:`summarize` line.

    Raises:
        CheckpointFormatError, UntrustedCheckpointError: as training would,
            or a damaged record.
    """
    obj = load_checkpoint_file(path, map_location='cpu')
    with CheckpointArchive(path, path) as archive:
        archive.verify()
    return summarize(obj)


def convert_checkpoint(src: str, dst: str) -> Tuple[bool, str]:
    """Write ``src`` as a plain ``torch.save`` zip archive at ``dst``.

    Returns:
        tuple: (whether ``dst`` was written, what happened).

    Raises:
        CheckpointFormatError: a format that cannot be converted without
            trusting the file (tar, TorchScript, a raw pickle ...), or a
            damaged file.
        UntrustedCheckpointError: the old file holds something other than
            plain data.
        FileExistsError: ``dst`` exists.
    """
    head = _head(src)
    if head.startswith(b'PK\x03\x04'):
        try:
            summary = check_checkpoint(src)
        except CheckpointFormatError as err:
            if err.damaged:
                raise
            # a TorchScript or another archive: not convertible here
            raise CheckpointFormatError(f'{err} {ISOLATED_HINT}',
                                        damaged=False, filename=src) from err
        return False, (f'{src} already loads as plain data ({summary}); '
                       'nothing to convert')
    if not is_legacy_file(src):
        raise CheckpointFormatError(
            f'[mmsafe] {src} is {describe_non_zip(head)}. {ISOLATED_HINT}',
            filename=src)
    if osp.exists(dst):
        raise MMSafeFileExistsError(
            f'{dst} exists; choose another output path')
    obj = load_legacy_checkpoint(src)
    atomic_write(dst, lambda f: torch.save(obj, f))
    summary = check_checkpoint(dst)
    return True, (f'converted {src} (legacy format) to {dst}: it loads as '
                  f'plain data ({summary})')


# ---------------------------------------------- the legacy format --
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
    return CheckpointRules(None, 'cpu', torch_objects=_LegacyStorages(0))


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
                                    'format (magic number or version)',
                                    filename=path)
    if type(info) is not dict or info.get('little_endian') is not True:
        raise CheckpointFormatError(f'{path} was saved on a big-endian '
                                    'machine', filename=path)
    storages = _LegacyStorages(len(data) - pos)
    rules = CheckpointRules(None, 'cpu', torch_objects=storages)
    reader = CheckpointUnpickler(data, rules, pos, to_end=False)
    result = reader.load()
    keys_reader = CheckpointUnpickler(data, _plain_rules(), reader.pos,
                                      to_end=False)
    keys = keys_reader.load()
    pos = keys_reader.pos
    if type(keys) is not list or not all(type(k) is str for k in keys) \
            or sorted(keys) != sorted(storages.refs):
        raise CheckpointFormatError(
            f'{path}: its list of storages does not match its pickle',
            filename=path)
    for key in keys:
        pos = _fill(data, pos, storages.refs[key], path)
    if pos != len(data):
        raise CheckpointFormatError(f'{path}: {len(data) - pos} bytes follow '
                                    'its last storage', filename=path)
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
            f'{ref.numel} in its pickle (or is cut short)', filename=path)
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

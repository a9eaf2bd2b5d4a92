"""The container gate: only the zip archive of a plain ``torch.save`` is
read; every other kind of file is refused before its pickle is read, with
one error that names the file and what it is."""
import io
import os
import tarfile
import zipfile

import numpy as np
import pytest
import torch

import mmsafe  # noqa: F401
from mmsafe.checkpoint import CheckpointFormatError, load_checkpoint_file
from mmsafe.checkpoint.container import CheckpointArchive
from tests.checkpoint import payloads as p


def _refused(path, *phrases):
    with pytest.raises(CheckpointFormatError) as info:
        load_checkpoint_file(path)
    message = str(info.value)
    assert message.startswith(f"[mmsafe] Refused to load checkpoint "
                              f"'{path}'"), message
    for phrase in phrases:
        assert phrase in message, message
    return info.value


def _records(path):
    with zipfile.ZipFile(path) as archive:
        return [(i.filename, archive.read(i)) for i in archive.infolist()]


def _rewrite(path, records, compress=()):
    with zipfile.ZipFile(path, 'w') as archive:
        for name, data in records:
            archive.writestr(name, data, zipfile.ZIP_DEFLATED
                             if name in compress else zipfile.ZIP_STORED)
    return path


class Plain(torch.nn.Module):

    def forward(self, x):
        return x + 1


def test_torchscript_archive_is_refused_by_what_it_is(tmp_path):
    path = str(tmp_path / 'scripted.pt')
    torch.jit.save(torch.jit.script(Plain()), path)
    error = _refused(path, 'is a TorchScript archive', 'holds code',
                     'converting-an-old-checkpoint')
    assert not error.damaged


def test_old_formats_and_foreign_files(tmp_path):
    legacy = str(tmp_path / 'legacy.pth')
    torch.save({'w': torch.ones(2)}, legacy,
               _use_new_zipfile_serialization=False)
    _refused(legacy, 'legacy (non-zip) format of torch < 1.6')
    tar = str(tmp_path / 'old.tar')
    with tarfile.open(tar, 'w') as archive:
        info = tarfile.TarInfo('storages')
        info.size = 4
        archive.addfile(info, io.BytesIO(b'data'))
    _refused(tar, 'is a tar archive')
    raw = tmp_path / 'raw.pkl'
    raw.write_bytes(b'\x80\x04K\x01.')
    _refused(str(raw), 'a raw pickle')
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    _refused(str(empty), 'an empty file')
    other = tmp_path / 'weights.npz'
    np.savez(str(other), a=np.ones(2))
    _refused(str(other), "'a.npy' outside the one folder")
    text = tmp_path / 'notes.txt'
    text.write_text('hello')
    _refused(str(text), 'not a PyTorch checkpoint')


def test_special_files_are_refused_without_waiting(tmp_path):
    fifo = str(tmp_path / 'fifo.pth')
    os.mkfifo(fifo)  # opening it for reading would wait for a writer
    _refused(fifo, 'is not a regular file')
    _refused(str(tmp_path), 'is not a regular file')


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / 'ckpt.pth')
    torch.save(dict(w=torch.arange(4.), b=torch.zeros(2)), path)
    return path


def test_records_outside_a_plain_save(saved):
    records = _records(saved)
    folder = records[0][0].split('/')[0]
    cases = [
        (records + [(f'{folder}/constants.pkl', b'')], 'TorchScript'),
        (records + [(f'{folder}/code/__torch__.py', b'')], 'TorchScript'),
        (records + [(f'{folder}/extra/x', b'')], 'TorchScript'),
        (records + [(f'{folder}/.data/extern_modules', b''),
                    (f'{folder}/.data/python_version', b'3')],
         'torch.package'),
        (records + [(f'{folder}/model.py', b'')], 'Python source'),
        (records + [(f'{folder}/unknown', b'')], 'does not write'),
        (records + [('other/data.pkl', b'')], 'outside the one folder'),
        ([r for r in records if not r[0].endswith('data.pkl')],
         'has no data.pkl'),
    ]
    for layout, phrase in cases:
        _refused(_rewrite(saved, layout), phrase)


def test_records_that_disagree_with_the_pickle(saved):
    records = _records(saved)
    by_name = dict(records)
    storage = next(n for n in by_name if '/data/' in n)

    def changed(name, data):
        return [(n, data if n == name else d) for n, d in records]

    # a storage record shorter or longer than the pickle claims
    _refused(_rewrite(saved, changed(storage, by_name[storage][:-4])),
             'bytes), but its record')
    _refused(_rewrite(saved, changed(storage, by_name[storage] + b'\0')),
             'bytes), but its record')
    # a storage record the pickle never names / names but is missing
    _refused(_rewrite(saved, records + [(storage[:-1] + '7', b'')]),
             'never uses')
    _refused(_rewrite(saved, [r for r in records if r[0] != storage]),
             'no data/ record')
    byteorder = next((n for n in by_name if n.endswith('/byteorder')),
                     None)  # torch 2.0 writes no byteorder record
    if byteorder is not None:
        _refused(_rewrite(saved, changed(byteorder, b'big')),
                 "byte order b'big'")
    version = next(n for n in by_name if n.endswith('/version'))
    _refused(_rewrite(saved, changed(version, b'7\n')), 'format version')
    _refused(_rewrite(saved, records, compress={storage}),
             'compressed record')


def test_damaged_containers(saved, tmp_path):
    data = open(saved, 'rb').read()
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(data[:len(data) // 2])
    assert _refused(str(cut), 'damaged or truncated zip archive').damaged
    prefixed = tmp_path / 'prefixed.pth'
    prefixed.write_bytes(b'PK\x03\x04' + b'\0' * 60 + data)
    _refused(str(prefixed))
    # a flipped byte inside a tensor's record: a load reads it as data
    # (torch does not check it either); verify() finds it
    offset = data.index(np.arange(4, dtype=np.float32).tobytes())
    flipped = tmp_path / 'flipped.pth'
    flipped.write_bytes(data[:offset] + b'\x01' + data[offset + 1:])
    assert not torch.equal(load_checkpoint_file(str(flipped))['w'],
                           torch.arange(4.))
    with CheckpointArchive(str(flipped), 'x') as archive:
        with pytest.raises(CheckpointFormatError, match='CRC mismatch'):
            archive.verify()
    # a flipped byte in the pickle is refused on every load
    pickle_at = data.index(b'_rebuild_tensor_v2')
    broken = tmp_path / 'broken.pth'
    broken.write_bytes(data[:pickle_at] + b'X' + data[pickle_at + 1:])
    assert _refused(str(broken), 'CRC mismatch').damaged


def _byte_tensor(key, numel):
    return (p.op_global('torch._utils', '_rebuild_tensor_v2') + p.MARK +
            p.storage_pid(key, numel, kind='ByteStorage') + p.op_int(0) +
            p.op_int(numel) + p.TUPLE1 + p.op_int(1) + p.TUPLE1 + p.FALSE +
            p.op_global('collections', 'OrderedDict') + p.EMPTY_TUPLE +
            p.REDUCE + p.TUPLE + p.REDUCE)


def test_duplicate_and_overlapping_records(saved, tmp_path):
    records = _records(saved)
    with pytest.warns(UserWarning):
        _rewrite(saved, records + [records[0]])
    _refused(saved, 'two records with the same name')
    # Record B's directory entry points at a copy of B's local record
    # hidden inside record A's bytes (overlapping records).
    second = b'\x07' * 8
    plain = str(tmp_path / 'plain.pth')
    p.write_zip(plain, p.in_dict(('b', _byte_tensor('1', 8))),
                {'1': second})
    raw = open(plain, 'rb').read()
    with zipfile.ZipFile(plain) as archive:
        info = archive.getinfo('archive/data/1')
    header = info.header_offset
    name_len = int.from_bytes(raw[header + 26:header + 28], 'little')
    extra_len = int.from_bytes(raw[header + 28:header + 30], 'little')
    hidden = raw[header:header + 30 + name_len + extra_len] + second
    path = str(tmp_path / 'overlap.pth')
    p.write_zip(path, p.in_dict(('a', _byte_tensor('0', len(hidden))),
                                ('b', _byte_tensor('1', 8))),
                {'0': hidden, '1': second})
    raw = bytearray(open(path, 'rb').read())
    with zipfile.ZipFile(path) as archive:
        first = archive.getinfo('archive/data/0')
    first_data = first.header_offset + 30 + int.from_bytes(
        raw[first.header_offset + 26:first.header_offset + 28], 'little') + \
        int.from_bytes(raw[first.header_offset + 28:first.header_offset + 30],
                       'little')
    at = _central_entry(raw, 'archive/data/1')
    raw[at + 42:at + 46] = first_data.to_bytes(4, 'little')
    open(path, 'wb').write(bytes(raw))
    with zipfile.ZipFile(path) as archive:  # zipfile itself reads it
        assert archive.read('archive/data/1') == second
    _refused(path, 'overlapping another')


def _central_entry(raw, name):
    start = 0
    while True:
        at = raw.index(b'PK\x01\x02', start)
        length = int.from_bytes(raw[at + 28:at + 30], 'little')
        if raw[at + 46:at + 46 + length] == name.encode():
            return at
        start = at + 4


def test_verify_reads_every_record(saved):
    with CheckpointArchive(saved, saved) as archive:
        archive.verify()
        assert sorted(archive.storage_sizes.values()) == [8, 16]

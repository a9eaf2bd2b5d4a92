"""The container of a checkpoint, checked before any of it is read.

``torch.save`` writes a zip archive whose records all sit in one folder::

    <folder>/data.pkl                  the pickle of the saved object
    <folder>/data/<key>                one record per storage (raw bytes)
    <folder>/byteorder                 b'little' (torch >= 1.12)
    <folder>/version                   the format version (b'3\\n')
    <folder>/.format_version           newer torch
    <folder>/.storage_alignment        newer torch
    <folder>/.data/serialization_id    torch >= 2.1

:class:`CheckpointArchive` accepts exactly that and refuses everything else
with one :class:`~.errors.CheckpointFormatError` that names the file and
what it is: a TorchScript archive (it holds code, which ``torch.load`` of
torch < 2.6 runs through ``torch.jit.load``), a torch.package or
torch.export archive, a tar file or the legacy (non-zip) format of torch <
1.6, a raw pickle, an empty file, a FIFO or device, a damaged zip. Every
record must be stored (not compressed, not encrypted), lie inside the file
without overlapping another, carry the name its central-directory entry
gives, and pass its CRC when read; the byte order must be little-endian.
The sizes that the pickle claims for its storages are checked against
these records by :mod:`.tensors` before a storage is built.

Storage bytes are read into memory or, with ``mmap=True``, mapped from the
file this archive opened and checked (private copy-on-write pages: the
file is never written). Their CRCs are not computed on a load (as torch
does not; a damaged tensor is data, not a danger): :meth:`verify` checks
them, for auto-resume's choice and ``tools/convert_checkpoint.py
--check``. The pickle and the small records are CRC-checked on every
load.
"""
import codecs
import io
import mmap
import os
import re
import stat
import struct
import zipfile
import zlib
from typing import IO, Any, Dict, List, Optional, Tuple, Union

import torch

from mmsafe.errors import MMSafeTypeError, MMSafeValueError
from .errors import (CONVERT_HINT, DAMAGED_HINT, LEGACY_HINT,
                     CheckpointFormatError, refusal_message)

ZIP_MAGIC = b'PK\x03\x04'
#: torch's legacy (non-zip) format starts with this number, pickled
LEGACY_MAGIC = (0x1950a86a20f9469cfc6c).to_bytes(10, 'little')
#: local file header: signature, version, flags, method, time, date, crc,
#: compressed size, size, name length, extra length
_LOCAL_HEADER = struct.Struct('<4sHHHHHLLLHH')
#: flag bits a stored record may carry: sizes in a data descriptor (bit 3,
#: which torch's writer sets) and UTF-8 names (bit 11)
_ALLOWED_FLAGS = 0x0008 | 0x0800
#: the small records of a plain torch.save, and the most bytes each holds
SMALL_RECORDS = {'version': 16, 'byteorder': 16, '.format_version': 16,
                 '.storage_alignment': 16, '.data/serialization_id': 64}
#: format versions a plain torch.save writes (torch 1.6 to the newest)
SUPPORTED_VERSIONS = frozenset({1, 2, 3})
_STORAGE_RECORD = re.compile(r'data/([0-9]{1,20})$')
_TORCHSCRIPT = ('constants.pkl', 'attributes.pkl', 'bytecode.pkl')
_TORCHSCRIPT_FOLDERS = ('code/', 'extra/', 'constants/', '.data/')
_PACKAGE = ('.data/extern_modules', '.data/python_version')
#: exceptions by which zipfile and struct report a malformed container
_MALFORMED = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError,
              struct.error, ValueError, OverflowError, UnicodeDecodeError,
              NotImplementedError, OSError, KeyError, IndexError)

Source = Union[str, os.PathLike, IO[bytes]]

# zip names without the UTF-8 flag are cp437: its codec is imported here,
# not by the first such file (a load imports nothing).
codecs.lookup('cp437')


def describe_non_zip(head: bytes) -> str:
    """What a file that does not start with a zip record is, from its first
    bytes (at least 512 of them when the file has them)."""
    if not head:
        return 'an empty file'
    if head[257:262] == b'ustar':
        return ("a tar archive (torch's oldest checkpoint format, whose "
                'loader extracts files from it)')
    if LEGACY_MAGIC in head[:32]:
        return ('a checkpoint in the legacy (non-zip) format of torch < 1.6 '
                '(or torch.save(..., _use_new_zipfile_serialization=False))')
    if head[:1] == b'\x80':
        return 'a raw pickle, not a torch.save zip archive'
    if head.startswith(b'PK'):
        return 'a zip archive that does not start with a record'
    if head[:2] == b'\x1f\x8b':
        return 'a gzip file'
    if len(head) > 8 and head[8:9] == b'{':
        return 'a safetensors file (or another JSON-headed format)'
    return f'not a PyTorch checkpoint (it starts with {head[:8]!r})'


def describe_foreign_zip(names: List[str]) -> Optional[str]:
    """What a zip archive with records other than a plain torch.save's is,
    when its records say it (``names`` relative to its folder)."""
    if any((n in _TORCHSCRIPT or n.startswith(_TORCHSCRIPT_FOLDERS))
           and n not in SMALL_RECORDS for n in names):
        if any(n.startswith(_PACKAGE) for n in names):
            return 'a torch.package archive (it holds Python source code)'
        return ('a TorchScript archive (torch.jit.save: it holds code, which '
                'torch.load of torch < 2.6 runs through torch.jit.load)')
    if any(n.endswith('.py') for n in names):
        return 'an archive that holds Python source code'
    if any(n == 'archive_format' or n.startswith('models/') for n in names):
        return 'a torch.export archive (it holds a program, not weights)'
    return None


class _Record:
    """Where a record's bytes are, and their CRC."""

    __slots__ = ('name', 'header', 'offset', 'size', 'crc')

    def __init__(self, name: str, header: int, offset: int, size: int,
                 crc: int):
        self.name, self.header, self.offset = name, header, offset
        self.size, self.crc = size, crc


class CheckpointArchive:
    """A checkpoint's zip container, checked when opened.

    Args:
        source (str | PathLike | file): a path, or a binary file object
            (read from its current position).
        name (str): how errors name the file.
        mmap (bool): map storages from the file instead of reading them
            (``source`` must be a path).

    Raises:
        CheckpointFormatError: the file is not the container of a plain
            ``torch.save`` (what it is instead is named), or is damaged.
    """

    def __init__(self, source: Source, name: str, mmap: bool = False):
        self.name = name
        self.mmap = bool(mmap)
        self._path: Optional[str] = None
        self._file, self.size = self._open(source)
        self._map: Optional[mmap.mmap] = None
        try:
            self._records = self._check_container()
            self.pickle = self._read(self._records['data.pkl'])
            self._check_small_records()
        except BaseException:
            self.close()
            raise
        #: storage key -> record size in bytes
        self.storage_sizes: Dict[str, int] = {
            m.group(1): rec.size for rel, rec in self._records.items()
            for m in [_STORAGE_RECORD.match(rel)] if m}

    # -------------------------------------------------------- opening --
    def _open(self, source: Source) -> Tuple[IO[bytes], int]:
        if isinstance(source, (str, os.PathLike)):
            self._path = os.fspath(source)
            # O_NONBLOCK: opening a FIFO must not wait for a writer; it has
            # no effect on a regular file.
            flags = os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0) | \
                getattr(os, 'O_NOCTTY', 0)
            fd = os.open(self._path, flags)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                raise self.refuse(f'is not a regular file (mode '
                                  f'{stat.filemode(info.st_mode)})')
            return os.fdopen(fd, 'rb', buffering=0), info.st_size
        if self.mmap:
            raise MMSafeValueError('mmap=True needs the checkpoint as a file '
                                   f'name, not {type(source).__name__}')
        if isinstance(source, io.BytesIO) and source.tell() == 0:
            return source, len(source.getbuffer())
        data = source.read()
        if not isinstance(data, bytes):
            raise MMSafeTypeError(
                f'{self.name}: the file object must be opened in '
                'binary mode')
        return io.BytesIO(data), len(data)

    def close(self) -> None:
        if self._path is not None and self._file is not None:
            self._file.close()
        self._file = None

    def __enter__(self) -> 'CheckpointArchive':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def refuse(self, what: str, cause: Optional[BaseException] = None,
               damaged: bool = False,
               how: Optional[str] = None) -> CheckpointFormatError:
        """The error for this file: ``what`` says what is wrong;
        ``damaged``: the file is broken rather than of another kind;
        ``how``: what to do (by default: convert it)."""
        detail = f' ({type(cause).__name__}: {cause})' if cause else ''
        how = how or (DAMAGED_HINT if damaged else CONVERT_HINT)
        return CheckpointFormatError(
            refusal_message(self.name, f'it {what}{detail}. {how}'),
            damaged=damaged, filename=self.name)

    # ------------------------------------------------------- checking --
    def _read_at(self, offset: int, size: int) -> bytes:
        self._file.seek(offset)
        data = self._file.read(size)
        if len(data) != size:
            raise self.refuse(f'is truncated (a record at byte {offset} '
                              f'needs {size} bytes)', damaged=True)
        return data

    def _check_container(self) -> Dict[str, _Record]:
        head = self._read_at(0, min(self.size, 512))
        if not head.startswith(ZIP_MAGIC):
            legacy = LEGACY_MAGIC in head[:32]
            raise self.refuse(f'is {describe_non_zip(head)}',
                              how=LEGACY_HINT if legacy else None)
        try:
            self._file.seek(0)
            with zipfile.ZipFile(self._file) as archive:
                infos = archive.infolist()
        except _MALFORMED as err:
            raise self.refuse('is a damaged or truncated zip archive',
                              err, damaged=True) from err
        if not infos:
            raise self.refuse('is a zip archive without records')
        folder = infos[0].filename.split('/', 1)[0]
        relative = []
        for info in infos:
            parts = info.filename.split('/', 1)
            if len(parts) != 2 or parts[0] != folder or not folder or \
                    folder in ('.', '..'):
                raise self.refuse(f'has the record {info.filename!r} '
                                  'outside the one folder torch.save writes')
            relative.append(parts[1])
        if len(set(relative)) != len(relative):
            raise self.refuse('has two records with the same name')
        foreign = describe_foreign_zip(relative)
        if foreign:
            raise self.refuse(f'is {foreign}')
        unexpected = [n for n in relative if n != 'data.pkl'
                      and n not in SMALL_RECORDS
                      and not _STORAGE_RECORD.match(n)]
        if unexpected:
            raise self.refuse(f'has records that torch.save does not write '
                              f'for plain data: {unexpected[:5]}')
        if 'data.pkl' not in relative:
            raise self.refuse('has no data.pkl record')
        records = {}
        for rel, info in zip(relative, infos):
            records[rel] = self._check_record(info, rel)
        self._check_layout(records)
        return records

    def _check_record(self, info: zipfile.ZipInfo, rel: str) -> _Record:
        if info.compress_type != zipfile.ZIP_STORED:
            raise self.refuse(f'has the compressed record {info.filename!r} '
                              '(torch.save stores records uncompressed)')
        if info.flag_bits & ~_ALLOWED_FLAGS:
            raise self.refuse(f'has the record {info.filename!r} with flags '
                              f'{info.flag_bits:#x} (encrypted or unknown)')
        if info.file_size != info.compress_size:
            raise self.refuse(f'has the record {info.filename!r} whose two '
                              'sizes differ')
        if not 0 <= info.header_offset <= self.size - _LOCAL_HEADER.size:
            raise self.refuse(f'places {info.filename!r} outside the file')
        header = self._read_at(info.header_offset, _LOCAL_HEADER.size)
        (magic, _, flags, method, _, _, _, _, _, name_len,
         extra_len) = _LOCAL_HEADER.unpack(header)
        encoding = 'utf-8' if info.flag_bits & 0x800 else 'cp437'
        name = self._read_at(info.header_offset + _LOCAL_HEADER.size,
                             name_len)
        if magic != ZIP_MAGIC or method != zipfile.ZIP_STORED or \
                flags & ~_ALLOWED_FLAGS or \
                name != info.orig_filename.encode(encoding):
            raise self.refuse(f'has a local header for {info.filename!r} '
                              'that disagrees with its directory entry')
        offset = info.header_offset + _LOCAL_HEADER.size + name_len + \
            extra_len
        if offset + info.file_size > self.size:
            raise self.refuse(f'is truncated: the record {info.filename!r} '
                              'ends past the end of the file', damaged=True)
        return _Record(rel, info.header_offset, offset, info.file_size,
                       info.CRC)

    def _check_layout(self, records: Dict[str, _Record]) -> None:
        """Records lie one after another from the start of the file."""
        spans = sorted((rec.header, rec.offset + rec.size, rec.name)
                       for rec in records.values())
        if spans[0][0] != 0:
            raise self.refuse('has data before its first record')
        end = 0
        for start, stop, rel in spans:
            if start < end:
                raise self.refuse(f'has the record {rel!r} overlapping '
                                  'another')
            end = stop

    def _read(self, record: _Record) -> bytes:
        data = self._read_at(record.offset, record.size)
        if zlib.crc32(data) != record.crc:
            raise self.refuse(f'has a damaged record {record.name!r} (CRC '
                              'mismatch)', damaged=True)
        return data

    def _check_small_records(self) -> None:
        values = {}
        for rel, limit in SMALL_RECORDS.items():
            record = self._records.get(rel)
            if record is None:
                continue
            if record.size > limit:
                raise self.refuse(f'has a {record.size}-byte {rel!r} record')
            values[rel] = self._read(record)
        order = values.get('byteorder', b'little')
        if order != b'little':
            raise self.refuse(f'has byte order {order[:16]!r}: mmsafe reads '
                              'little-endian checkpoints only (re-save it on '
                              'a little-endian machine)')
        version = values.get('version')
        if version is not None and not (
                version.strip().isdigit()
                and int(version.strip()) in SUPPORTED_VERSIONS):
            raise self.refuse(f'has the format version {version[:16]!r} '
                              f'(supported: {sorted(SUPPORTED_VERSIONS)})')
        for rel in ('.format_version', '.storage_alignment',
                    '.data/serialization_id'):
            value = values.get(rel)
            if value is not None and not value.strip().isdigit():
                raise self.refuse(f'has a {rel!r} record that is not a '
                                  'number')

    def verify(self) -> None:
        """Read every storage record and check its CRC (in chunks, without
        keeping the bytes)."""
        for record in self._records.values():
            self._file.seek(record.offset)
            crc, left = 0, record.size
            while left:
                chunk = self._file.read(min(left, 1 << 24))
                if not chunk:
                    raise self.refuse(f'is truncated in {record.name!r}',
                                      damaged=True)
                crc = zlib.crc32(chunk, crc)
                left -= len(chunk)
            if crc != record.crc:
                raise self.refuse(f'has a damaged record {record.name!r} '
                                  '(CRC mismatch)', damaged=True)

    # ------------------------------------------------------- storages --
    def storage(self, key: str) -> torch.UntypedStorage:
        """The bytes of the record ``data/<key>`` as a CPU storage (not
        CRC-checked: :meth:`verify`)."""
        record = self._records[f'data/{key}']
        if record.size == 0:
            return torch.UntypedStorage(0)
        if self.mmap:
            if self._map is None:
                # the file this archive checked (its descriptor, not its
                # path again), private copy-on-write pages
                self._map = mmap.mmap(self._file.fileno(), 0,
                                      access=mmap.ACCESS_COPY)
            return torch.frombuffer(self._map, dtype=torch.uint8,
                                    count=record.size,
                                    offset=record.offset).untyped_storage()
        buffer = torch.empty(record.size, dtype=torch.uint8)
        view = memoryview(buffer.numpy())
        self._file.seek(record.offset)
        done = 0
        while done < record.size:
            got = self._file.readinto(view[done:])
            if not got:
                raise self.refuse(f'is truncated in {record.name!r}',
                                  damaged=True)
            done += got
        return buffer.untyped_storage()

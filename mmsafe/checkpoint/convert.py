"""Converting an old checkpoint once, deliberately, outside training.

Training reads only the zip archive of a plain ``torch.save``
(:mod:`.loader`). :func:`convert_checkpoint` turns what can be converted
without running anything of the file into that format:

* torch's legacy (non-zip) format of torch < 1.6, which many published
  model zoo files still have: read as plain data by
  :func:`~.legacy.load_legacy_checkpoint` (the same unpickler, allowlist
  and checks as training; nothing of the file runs), written with
  ``torch.save``, then loaded back with mmsafe's loader;
* a file that already loads is left alone.

A tar file (torch's oldest format) and a TorchScript archive hold files to
extract or code to run: no tool converts them without trusting them. The
error says what to do: load the file with the torch that wrote it in an
isolated, throwaway environment (a container without network, credentials
or your data), save its ``state_dict()`` with ``torch.save``, and check the
result here (:func:`check_checkpoint`).
"""
import os
import os.path as osp
import stat
from typing import Any, Tuple

import torch

from mmsafe.errors import MMSafeFileExistsError
from .atomic import atomic_write
from .container import CheckpointArchive, describe_non_zip
from .errors import CheckpointFormatError
from .legacy import is_legacy_file, load_legacy_checkpoint
from .loader import load_checkpoint_file

ISOLATED_HINT = (
    'No tool converts it without trusting it. If you must use it: in an '
    'isolated, throwaway environment (a container without network, '
    'credentials or your data) with the torch that wrote it, load it and '
    'save only its weights, e.g. `torch.save(torch.jit.load(f).state_dict()'
    ', out)` for TorchScript; then check the new file with `python '
    'tools/convert_checkpoint.py --check out.pth`.')


def _head(path: str) -> bytes:
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointFormatError(f'{path} is not a regular file')
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
                                        damaged=False) from err
        return False, (f'{src} already loads as plain data ({summary}); '
                       'nothing to convert')
    if not is_legacy_file(src):
        raise CheckpointFormatError(
            f'[mmsafe] {src} is {describe_non_zip(head)}. {ISOLATED_HINT}')
    if osp.exists(dst):
        raise MMSafeFileExistsError(
            f'{dst} exists; choose another output path')
    obj = load_legacy_checkpoint(src)
    atomic_write(dst, lambda f: torch.save(obj, f))
    summary = check_checkpoint(dst)
    return True, (f'converted {src} (legacy format) to {dst}: it loads as '
                  f'plain data ({summary})')

"""Loading a checkpoint file as plain data, the same way on every torch.

:func:`load_checkpoint_file` is mmsafe's ``torch.load``: it never calls
``torch.load`` (whose loader differs between torch releases: torch < 2.6
runs TorchScript archives through ``torch.jit.load`` and extracts tar
members, torch 2.1 trusts the storage sizes a pickle claims) and never
runs anything a file names. In order:

1. :class:`~.container.CheckpointArchive` checks the container: only the
   zip archive of a plain ``torch.save``; everything else is refused with
   :class:`~.errors.CheckpointFormatError`, before its pickle is read;
2. :class:`~.unpickler.CheckpointUnpickler` reads ``data.pkl`` under
   :class:`~.allowlist.CheckpointRules`: the opcodes of plain data, and
   each allowed callable with its arguments checked, then the classes and
   functions trusted now (:mod:`.trust`); storages are built from the
   checked records;
3. :func:`~.plain_data.check_plain_data` refuses anything in the result
   that is not plain data, cycles, deep nesting and shared-reference
   bombs.

A refusal raised on the way names no file; the loader completes it for
the file it loads (:func:`complete_refusal`), so that every refusal is one
error that names the file and what it holds.
"""
import os
from typing import Any, Optional

from mmsafe.errors import MMSafeFileNotFoundError
from .allowlist import CheckpointRules
from .container import CheckpointArchive
from .errors import (CONVERT_DOC, DAMAGED_HINT, PLAIN_DATA_NOTE,
                     CheckpointFormatError, CheckpointRefusal,
                     UntrustedCheckpointError, refusal_message)
from .plain_data import check_plain_data, node_budget
from .trust import TrustedObjects, active_trusted_globals, opt_in_hint
from .unpickler import CheckpointUnpickler


def display_name(f: Any) -> str:
    """How errors name the checkpoint ``f`` (a path or a file object)."""
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    name = getattr(f, 'name', None)
    return name if isinstance(name, str) else f'<{type(f).__name__}>'


def complete_refusal(name: str, err: CheckpointRefusal) -> CheckpointRefusal:
    """``err``, raised while reading the checkpoint ``name`` (it names no
    file), as the refusal of that file, with what to do."""
    if isinstance(err, UntrustedCheckpointError):
        hint = opt_in_hint(err.global_name) if err.global_name else (
            'A checkpoint needs only plain data: re-save it with torch.save '
            f'of its state dicts, or convert it once outside training '
            f'({CONVERT_DOC}).')
        return UntrustedCheckpointError(
            refusal_message(name, f'{err}. {PLAIN_DATA_NOTE} {hint}'),
            global_name=err.global_name, filename=name)
    damaged = getattr(err, 'damaged', True)
    hint = f' {DAMAGED_HINT}' if damaged else ''
    return CheckpointFormatError(refusal_message(name, f'{err}.{hint}'),
                                 damaged=damaged, filename=name)


def load_checkpoint_file(f: Any, map_location: Any = None,
                         mmap: Optional[bool] = None) -> Any:
    """Load the checkpoint ``f`` as plain data, on every torch.

    Args:
        f (str | PathLike | file): the checkpoint (a binary file object is
            read from its current position).
        map_location: as ``torch.load``'s: None (where it was saved), a
            device string or ``torch.device``, a dict of locations, or a
            callable ``(storage, location) -> storage``.
        mmap (bool, optional): map the storages from the file (a path)
            instead of reading them.

    Returns:
        The saved object: dicts, lists, tensors, numpy data, ...

    Raises:
        CheckpointFormatError: not the zip archive of a plain
            ``torch.save`` (a TorchScript, tar or legacy file, a raw pickle,
            anything else), or damaged.
        UntrustedCheckpointError: it holds something other than plain
            data; nothing of it ran.
    """
    name = display_name(f)
    trust = TrustedObjects(active_trusted_globals())
    with CheckpointArchive(f, name, mmap=bool(mmap)) as archive:
        rules = CheckpointRules(archive, map_location, trust)
        try:
            result = CheckpointUnpickler(archive.pickle, rules).load()
            rules.finish()
            check_plain_data(
                result, node_budget(len(archive.pickle)),
                history_types=(rules.history.cls, ), built=rules.built,
                trust=trust)
        except CheckpointRefusal as err:
            if err.filename is not None:
                raise  # complete: it names its file (the container's)
            raise complete_refusal(name, err) from err
    return result


def load_from_local(filename: str, map_location: Any = None) -> Any:
    """MMEngine's ``load_from_local`` (the CheckpointLoader scheme of plain
    paths), loading with :func:`load_checkpoint_file` (which also refuses
    a path that is not a regular file)."""
    filename = os.path.expanduser(filename)
    if not os.path.exists(filename):
        raise MMSafeFileNotFoundError(f'{filename} can not be found.')
    return load_checkpoint_file(filename, map_location)

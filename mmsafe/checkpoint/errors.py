"""How mmsafe refuses a checkpoint: two error types, and how a refusal
reads.

Both types are a :class:`CheckpointRefusal`, which is a
:class:`pickle.UnpicklingError` (what ``torch.load`` raises for a
weights-only refusal), so code that catches that keeps working:

* :class:`UntrustedCheckpointError`: the file's pickle asks for something
  other than plain data: an object outside the allowlist, a call with
  arguments outside what checkpoints use, a pickle opcode that builds
  objects. It names the object; where the object may be trusted, it says
  how (``mmsafe_trusted_globals``).
* :class:`CheckpointFormatError`: the file is not the zip container of a
  plain ``torch.save`` (a TorchScript archive, a tar or legacy file, a raw
  pickle, anything else), or its records disagree with what its pickle
  claims (sizes, byte order, missing or extra records), or it is truncated.

A check deep in a load (the unpickler, the allowlist, the plain-data
check) raises a refusal that says what is wrong and names no file
(``filename`` is None); :func:`~.loader.load_checkpoint_file` completes it
for the file it loads (:func:`refusal_message` and the hint of the kind).
A refusal whose ``filename`` is set (the container's, the loader's, the
conversion's) is complete and passes every layer unchanged.
"""
import pickle
from typing import Optional

from mmsafe.errors import MMSafeError

#: where the docs say how to convert an old checkpoint once
CONVERT_DOC = ('docs/user_guides/training_safety.md'
               '#converting-an-old-checkpoint')
CONVERT_HINT = ('mmsafe loads only the zip archive that torch.save writes for '
                'plain data. If you trust the file, convert it once, outside '
                f'training ({CONVERT_DOC}).')
LEGACY_HINT = ('mmsafe loads only the zip archive that torch.save writes. '
               'Convert it once: `python tools/convert_checkpoint.py OLD.pth '
               'NEW.pth` reads it with the same checks (nothing of it runs) '
               f'and writes that archive ({CONVERT_DOC}).')
DAMAGED_HINT = ('The file is damaged or truncated: use another checkpoint '
                '(--resume without a path picks the newest that loads).')
#: what an untrusted refusal says that mmsafe loads
PLAIN_DATA_NOTE = ('Nothing of it ran: mmsafe loads checkpoints as plain '
                   'data only (tensors, numbers, strings, containers, numpy '
                   "arrays, MMEngine's message hub), on every torch.")


def refusal_message(filename: str, what: str) -> str:
    """The beginning of every refusal that names its file."""
    return f'[mmsafe] Refused to load checkpoint {filename!r}: {what}'


class CheckpointRefusal(MMSafeError, pickle.UnpicklingError):
    """mmsafe does not load a checkpoint.

    Args:
        message (str): what is refused, and what to do.
        filename (str, optional): the file the message names; None for a
            refusal raised while reading, which the loader completes.
    """

    def __init__(self, message: str, filename: Optional[str] = None):
        super().__init__(message)
        self.filename = filename


class UntrustedCheckpointError(CheckpointRefusal):
    """A checkpoint holds a pickled object or call that mmsafe does not
    trust.

    Attributes:
        global_name (str, optional): the dotted name of the refused object,
            when a name was refused.
    """

    def __init__(self, message: str, global_name: Optional[str] = None,
                 filename: Optional[str] = None):
        super().__init__(message, filename)
        self.global_name = global_name


class CheckpointFormatError(CheckpointRefusal):
    """A checkpoint file is not the zip container of a plain ``torch.save``,
    or its records do not match what its pickle claims.

    Attributes:
        damaged (bool): the file looks broken (truncated, inconsistent)
            rather than of another kind.
    """

    def __init__(self, message: str, damaged: bool = True,
                 filename: Optional[str] = None):
        super().__init__(message, filename)
        self.damaged = damaged

"""The two ways mmsafe refuses a checkpoint.

Both are :class:`pickle.UnpicklingError` (what ``torch.load`` raises for a
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
"""
import pickle
from typing import Optional

from mmsafe.errors import MMSafeError


class UntrustedCheckpointError(MMSafeError, pickle.UnpicklingError):
    """A checkpoint holds a pickled object or call that mmsafe does not
    trust.

    Attributes:
        global_name (str, optional): the dotted name of the refused object,
            when a name was refused.
    """

    def __init__(self, message: str, global_name: Optional[str] = None):
        super().__init__(message)
        self.global_name = global_name


class CheckpointFormatError(MMSafeError, pickle.UnpicklingError):
    """A checkpoint file is not the zip container of a plain ``torch.save``,
    or its records do not match what its pickle claims.

    Attributes:
        damaged (bool): the file looks broken (truncated, inconsistent)
            rather than of another kind.
    """

    def __init__(self, message: str, damaged: bool = True):
        super().__init__(message)
        self.damaged = damaged

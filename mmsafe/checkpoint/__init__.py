"""Checkpoints: loading as plain data on every torch, atomic writes, resume
from the newest loadable checkpoint, pretrained weights from the torch hub
cache, and the one-off conversion of old formats.

A load, top to bottom (each module below the one before it):

* :mod:`.schemes`: every MMEngine ``CheckpointLoader`` scheme fetches the
  file (pretrained URLs from the torch hub cache: :mod:`.remote_weights`)
  and loads it with
* :mod:`.loader`: :func:`load_checkpoint_file`, in three checks:
  :mod:`.container` (the zip archive of a plain ``torch.save``),
  :mod:`.unpickler` under :mod:`.allowlist` (with :mod:`.tensors`,
  :mod:`.numpy_data`, :mod:`.history_buffer`, built on :mod:`.tokens`),
  then :mod:`.plain_data`;
* :mod:`.trust`: the classes and functions a project opts in, what a load
  does with them, and how a refusal says whether one may be trusted;
* :mod:`.errors`: the refusals (:class:`CheckpointFormatError`,
  :class:`UntrustedCheckpointError`) and how they read.

Beside the load: :mod:`.resume` (auto-resume from the newest loadable
checkpoint), :mod:`.atomic` (complete-or-absent writes), :mod:`.convert`
(an old format converted once, outside training).
"""
from .atomic import (ATOMIC_BACKEND_ARGS, AtomicLocalBackend, atomic_write,
                     is_local_path)
from .errors import (CheckpointFormatError, CheckpointRefusal,
                     UntrustedCheckpointError)
from .loader import load_checkpoint_file, load_from_local
from .remote_weights import WeightsUnavailableError
from .resume import (checkpoint_meta, checkpoint_problem,
                     find_latest_loadable_checkpoint, record_resume)
from .schemes import (register_checkpoint_schemes,
                      register_local_weights_only_scheme,
                      register_remote_weight_schemes)
from .trust import (explain_refusals, resolve_trusted_globals,
                    trusted_checkpoint_globals)

__all__ = [
    'ATOMIC_BACKEND_ARGS', 'AtomicLocalBackend', 'atomic_write',
    'is_local_path', 'CheckpointFormatError', 'CheckpointRefusal',
    'UntrustedCheckpointError', 'load_checkpoint_file', 'load_from_local',
    'WeightsUnavailableError', 'register_remote_weight_schemes',
    'checkpoint_meta', 'checkpoint_problem',
    'find_latest_loadable_checkpoint', 'record_resume',
    'register_checkpoint_schemes', 'register_local_weights_only_scheme',
    'explain_refusals', 'resolve_trusted_globals',
    'trusted_checkpoint_globals'
]

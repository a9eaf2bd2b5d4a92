"""Checkpoints: loading as plain data on every torch, atomic writes, resume
from the newest loadable checkpoint, pretrained weights from the torch hub
cache, and the one-off conversion of old formats."""
from .atomic import (ATOMIC_BACKEND_ARGS, AtomicLocalBackend, atomic_write,
                     is_local_path)
from .errors import CheckpointFormatError, UntrustedCheckpointError
from .loader import load_checkpoint_file, load_from_local
from .remote_weights import (WeightsUnavailableError,
                             register_remote_weight_schemes)
from .resume import (checkpoint_meta, checkpoint_problem,
                     find_latest_loadable_checkpoint, record_resume)
from .schemes import (register_checkpoint_schemes,
                      register_local_weights_only_scheme)
from .trust import (explain_refusals, resolve_trusted_globals,
                    trusted_checkpoint_globals)

__all__ = [
    'ATOMIC_BACKEND_ARGS', 'AtomicLocalBackend', 'atomic_write',
    'is_local_path', 'CheckpointFormatError', 'UntrustedCheckpointError',
    'load_checkpoint_file', 'load_from_local',
    'WeightsUnavailableError', 'register_remote_weight_schemes',
    'checkpoint_meta', 'checkpoint_problem',
    'find_latest_loadable_checkpoint', 'record_resume',
    'register_checkpoint_schemes', 'register_local_weights_only_scheme',
    'explain_refusals', 'resolve_trusted_globals',
    'trusted_checkpoint_globals'
]

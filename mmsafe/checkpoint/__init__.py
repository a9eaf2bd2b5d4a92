"""Checkpoints: trusted weights-only loading, atomic writes, resume from the
newest loadable checkpoint, pretrained weights from the torch hub cache."""
from .atomic import (ATOMIC_BACKEND_ARGS, AtomicLocalBackend, atomic_write,
                     is_local_path)
from .remote_weights import (WeightsUnavailableError,
                             register_remote_weight_schemes)
from .resume import (checkpoint_meta, checkpoint_problem,
                     find_latest_loadable_checkpoint, record_resume)
from .trust import (UntrustedCheckpointError, explain_refusals,
                    load_checkpoint_file, register_local_weights_only_scheme,
                    trusted_checkpoint_globals)

__all__ = [
    'ATOMIC_BACKEND_ARGS', 'AtomicLocalBackend', 'atomic_write',
    'is_local_path', 'WeightsUnavailableError',
    'register_remote_weight_schemes', 'checkpoint_meta', 'checkpoint_problem',
    'find_latest_loadable_checkpoint', 'record_resume',
    'UntrustedCheckpointError', 'explain_refusals', 'load_checkpoint_file',
    'register_local_weights_only_scheme', 'trusted_checkpoint_globals'
]

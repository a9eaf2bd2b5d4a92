"""What the main thread of a rank did last, and the names of its phases."""
import time
from typing import Optional

SETUP = 'setup (loading checkpoints, building the loop)'
DATA = 'data'
PREPROCESS = 'data preprocessing'
FORWARD = 'forward'
BACKWARD = 'backward'
BACKWARD_DDP = 'backward (DDP gradient all-reduce: a collective)'
STEP = 'optimizer step'
AFTER_STEP = 'hooks (after_train_iter)'
EPOCH_END = 'epoch end (validation or next epoch)'
CHECKPOINT = 'saving a checkpoint'

#: Phases of an evaluation start with its stage name ('validation', 'test').
EVAL_STAGES = ('validation', 'test')


def eval_phase(stage: str, what: str) -> str:
    """Phase name of an evaluation, e.g. ``'validation (forward)'``."""
    return f'{stage} ({what})'


class Heartbeat:
    """Progress marks of the main thread.

    Invariant: only the main thread writes (hook methods and the PyTorch
    hooks that :class:`~mmsafe.engine.hooks.HangWatchdogHook` registers run
    there), and each field is a single attribute store, so the watchdog
    thread reads a consistent-enough snapshot without a lock: ``seq``
    changes on every mark, ``phase`` names what started at the last mark.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.time = time.monotonic()
        self.phase = SETUP
        self.first = True  # the first iteration of an epoch is running
        self.batch_idx: Optional[int] = None

    def beat(self, phase: Optional[str] = None) -> None:
        """Record progress, and the phase that starts now when given."""
        if phase is not None:
            self.phase = phase
        self.time = time.monotonic()
        self.seq += 1

"""A hook's request to end training before the loop's own end."""
from typing import Optional


class StopTraining(Exception):
    """Raised by a hook (on every rank, at the same iteration) to end
    training now.

    :class:`~mmsafe.engine.runner.SafeRunner` ends the run cleanly when it
    catches one: it logs the reason, calls the ``after_train`` and
    ``after_run`` hooks (reports, final logs) and returns the model. Under
    another runner the exception ends the run with its message.

    Args:
        reason (str): why training stops, for the log.
        checkpoint (str, optional): the checkpoint saved before stopping.
    """

    def __init__(self, reason: str, checkpoint: Optional[str] = None):
        self.reason = reason
        self.checkpoint = checkpoint
        saved = f' (saved {checkpoint})' if checkpoint else ''
        super().__init__(f'[mmsafe] training stopped: {reason}{saved}')

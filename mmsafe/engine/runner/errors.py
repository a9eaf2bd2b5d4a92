"""The errors that end a distributed run when one rank fails."""
from typing import Any, Dict

from mmsafe.engine.rank_channel import failed_party, failure_place
from mmsafe.errors import MMSafeError

_COMMUNICATION_MARKERS = (
    'gloo', 'nccl', 'connection closed', 'connection reset', 'broken pipe',
    'timed out', 'timeout', 'processgroup', 'socket', 'peer',
    'monitoredbarrier', 'failed to pass', 'collective',
)


class DDPParameterError(MMSafeError, RuntimeError):
    """DDP's unused-parameter (or "marked as ready twice") error, explained:
    rank, iteration, loss terms, modules and the fix
    (:meth:`~mmsafe.engine.hooks.RankFaultHook.explain_failure`); PyTorch's own
    error is its ``__cause__``."""


class PeerRankFailedError(MMSafeError, RuntimeError):
    """This rank stopped because another rank failed first; the message
    names that rank, its iteration and its error.

    Args:
        record (dict): the failed rank's record
            (:meth:`~mmsafe.engine.rank_channel.RankChannel.publish_failure`).
        rank (int): this rank.
        own (BaseException, optional): this rank's own error, a consequence.
    """

    def __init__(self, record: Dict[str, Any], rank: int,
                 own: Any = None) -> None:
        self.record = record
        failed = record.get('rank')
        if failed is None:
            head = (f'[mmsafe] rank {rank} stopped: '
                    f'{record.get("message")}.')
        else:
            head = (f'[mmsafe] {failed_party(record)} failed'
                    f'{failure_place(record)}, so rank {rank} '
                    'could not go on')
            if own is not None:
                first = str(own).strip().splitlines()[0] if str(own) else ''
                head += f' (here: {type(own).__name__}: {first[:200]})'
            head += (f'. Rank {failed}\'s error:\n{record.get("type")}: '
                     f'{record.get("message")}')
        super().__init__(head)


def is_communication_error(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a failed collective or store operation
    (what a rank sees when another rank is gone). An error of mmsafe's own
    (``WeightsUnavailableError``, ...) names this rank's own fault, whatever
    words its message holds ("timeout 15 s")."""
    if isinstance(exc, MMSafeError):
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {'DistError', 'DistBackendError', 'DistNetworkError',
                'DistStoreError', 'ConnectionError'}:
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(marker in text for marker in _COMMUNICATION_MARKERS)

"""How a run of :class:`~mmsafe.engine.runner.SafeRunner` fails: named
where the user looks, on every rank.

* every run gets a :class:`~mmsafe.engine.hooks.RankFaultHook` (unless
  its config has one), which reports a loss term that a rank stops
  producing;
* under DDP a :class:`~mmsafe.engine.rank_channel.RankChannel` (in the run
  context) carries each rank's findings to rank 0's console and log at
  once, and a rank's exception to every rank;
* an exception of ``train``/``val``/``test`` is first offered to the
  hooks (:class:`~mmsafe.engine.run_context.FailureExplainer`: DDP's
  unused-parameter error becomes a
  :class:`~mmsafe.engine.runner.errors.DDPParameterError` that explains
  it); an error that only follows from another rank's failure (a closed
  connection) becomes a
  :class:`~mmsafe.engine.runner.errors.PeerRankFailedError` naming that
  rank's error; any other error is raised unchanged. Each is told to the
  other ranks, written to the event log (``rank_failed``), handed to the
  hooks' crash reports
  (:class:`~mmsafe.engine.run_context.CrashReporter`) and raised
  (PyTorch's error as the ``__cause__``);
* a rank still inside its run ``mmsafe_peer_grace`` seconds (config key,
  default 10) after another rank failed ends itself, instead of waiting
  out the distributed timeout; its report is written first.
"""
import atexit
import contextlib
import logging
from typing import Iterator, Optional

from mmsafe.registry import HOOKS
from mmsafe.dist import get_rank, get_world_size
from mmsafe.engine.rank_channel import (DEFAULT_PEER_GRACE, RankChannel,
                                        failed_party, failure_place)
from mmsafe.engine.run_context import run_context
from mmsafe.engine.utils import train_progress
from mmsafe.events import log, write_event
from mmsafe.guard_outputs import Event
from .errors import PeerRankFailedError, is_communication_error

#: Seconds a rank whose own error looks like a consequence of another
#: rank's failure (a closed connection, a timed-out collective) waits for
#: that rank's record, to name the cause instead of the symptom.
PEER_RECORD_WAIT = 3.0


def add_rank_fault_hook(runner) -> None:
    """Register a default ``RankFaultHook`` unless ``runner`` has one."""
    rank_fault_hook = HOOKS.get('RankFaultHook')
    if not any(isinstance(h, rank_fault_hook) for h in runner.hooks):
        runner.register_hook(rank_fault_hook())


class CrashPath:
    """The failure handling of one runner (see the module docstring).

    Args:
        runner: the runner (its ``cfg``, ``hooks``, ``work_dir``).
    """

    def __init__(self, runner) -> None:
        self.runner = runner

    def open_rank_channel(self) -> None:
        """Under DDP: open the run's rank channel (into the run context;
        closed at the process's exit)."""
        if get_world_size() < 2:
            return
        grace = self.runner.cfg.get('mmsafe_peer_grace', DEFAULT_PEER_GRACE)
        channel = RankChannel(get_rank(), get_world_size(),
                              grace=float(grace),
                              on_peer_failure=self._peer_failed,
                              before_exit=self._ending_for_peer)
        if channel.open(self.runner.logger):
            run_context(self.runner).rank_channel = channel
            atexit.register(channel.close)

    @contextlib.contextmanager
    def reported(self) -> Iterator[None]:
        """Around ``train``/``val``/``test``: an error leaving the block is
        explained, told to the other ranks, reported and raised."""
        channel = run_context(self.runner).rank_channel
        if channel is not None:
            channel.active = True
        try:
            yield
        except BaseException as exc:
            if channel is not None:
                channel.active = False
            explained = self._on_crash(exc)
            if explained is not None:
                raise explained from exc
            raise
        finally:
            if channel is not None:
                channel.active = False

    def _on_crash(self, exc: BaseException) -> Optional[BaseException]:
        """Explain, tell the other ranks, report; return the error to
        raise instead of ``exc`` (None: ``exc`` itself)."""
        runner = self.runner
        context = run_context(runner)
        channel = context.rank_channel
        rank = get_rank()
        details = context.explain_failure(runner, exc)
        peer = None
        if details is None and channel is not None:
            peer = channel.wait_for_peer_failure(
                PEER_RECORD_WAIT if is_communication_error(exc) else 0.0)
        explained: Optional[BaseException] = None
        if details is not None:
            explained = details.pop('error')
            root = dict(details, type=type(explained).__name__,
                        message=str(explained))
        elif peer is not None and is_communication_error(exc):
            explained = PeerRankFailedError(peer, rank, exc)
            root = peer
        else:
            _, done, _ = train_progress(runner)
            root = dict(rank=rank, type=type(exc).__name__,
                        message=str(exc),
                        iter=None if done is None else done + 1)
            if peer is not None:
                root = dict(root, after_peer=peer)
        final = explained or exc
        if root is not peer:
            write_event(runner.work_dir, Event.RANK_FAILED, **{
                k: v for k, v in root.items()
                if k not in ('message', 'cause', 'type', 'rank')},
                cause=root.get('cause', root.get('type')),
                error=f'{type(final).__name__}: {str(final)[:2000]}')
            if channel is not None:
                channel.publish_failure(root)
        context.report_crash(runner, final, root)
        return explained

    def _peer_failed(self, record: dict) -> None:
        """Another rank failed (called in the channel's listener thread):
        rank 0 says so in its log and writes the report at once, since a
        launcher may end this process any moment."""
        if get_rank() != 0:
            return
        log(f'{failed_party(record)} failed{failure_place(record)}: '
            f'{record.get("type")}: '
            f'{record.get("message")}', logging.ERROR)
        context = run_context(self.runner)
        channel = context.rank_channel
        if channel is not None and channel.active:
            # Still inside the run: the report now, since a launcher may end
            # this process any moment (a crash of this rank's own writes
            # its report itself).
            context.report_crash(self.runner, PeerRankFailedError(record, 0),
                                 record)

    def _ending_for_peer(self, record: dict) -> None:
        """This rank ends itself because another rank failed: its
        report first."""
        run_context(self.runner).report_crash(
            self.runner, PeerRankFailedError(record, get_rank()), record)

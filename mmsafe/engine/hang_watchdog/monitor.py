"""The thread that watches a :class:`Heartbeat` and raises the alarms."""
import faulthandler
import threading
import time
from typing import Callable, Optional

from .heartbeat import Heartbeat


class WatchdogThread:
    """Poll a heartbeat from a daemon thread.

    Every ``poll_interval`` seconds it compares the heartbeat's ``seq`` with
    the previous poll. Once the main thread made no progress for longer
    than ``allowance(phase, first)`` seconds, ``on_stall(phase, idle,
    allowance)`` is called once; ``abort_after`` more seconds without
    progress call ``on_abort(phase, idle)`` (which is expected to end the
    process); a mark after a stall calls ``on_resume(phase, stalled_s)``.

    Invariant: the callbacks run in this thread and only read the
    heartbeat; nothing here blocks the main thread.

    Args:
        heartbeat (Heartbeat): what the main thread marks.
        allowance (Callable): ``(phase, first) -> seconds`` allowed.
        on_stall, on_abort, on_resume (Callable): see above.
        poll_interval (float): seconds between polls.
        abort_after (float, optional): seconds after the allowance before
            ``on_abort``; None never aborts.
        native_backstop (bool): keep ``faulthandler.dump_traceback_later``
            armed a little past the allowance. It fires (stacks to stderr)
            only when this thread cannot run because the main thread holds
            the interpreter lock in native code.
    """

    def __init__(self, heartbeat: Heartbeat,
                 allowance: Callable[[str, bool], float],
                 on_stall: Callable[[str, float, float], None],
                 on_abort: Callable[[str, float], None],
                 on_resume: Callable[[str, float], None],
                 poll_interval: float,
                 abort_after: Optional[float] = None,
                 native_backstop: bool = True) -> None:
        self.heartbeat = heartbeat
        self.allowance = allowance
        self.on_stall = on_stall
        self.on_abort = on_abort
        self.on_resume = on_resume
        self.poll_interval = poll_interval
        self.abort_after = abort_after
        self.native_backstop = native_backstop
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, name='mmsafe-hang-watchdog', daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and disarm the native backstop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_interval * 2 + 1)
            self._thread = None
        if self.native_backstop:
            faulthandler.cancel_dump_traceback_later()

    def _arm_backstop(self, allowance: float) -> None:
        try:
            faulthandler.dump_traceback_later(
                allowance + 10 * self.poll_interval + 30, exit=False)
        except (RuntimeError, ValueError, OSError):
            self.native_backstop = False  # no usable stderr

    def _watch(self) -> None:
        stalled_seq = None
        stalled_at = 0.
        while True:
            stopping = self._stop.wait(self.poll_interval)
            hb = self.heartbeat
            seq, last, phase, first = hb.seq, hb.time, hb.phase, hb.first
            if stalled_seq is not None and seq != stalled_seq:
                self.on_resume(phase, last - stalled_at)
                stalled_seq = None
            if stopping:
                return
            allowance = self.allowance(phase, first)
            idle = time.monotonic() - last
            if self.native_backstop:
                self._arm_backstop(allowance)
            if idle <= allowance:
                continue
            if stalled_seq is None:
                stalled_seq, stalled_at = seq, last
                self.on_stall(phase, idle, allowance)
            elif self.abort_after is not None and \
                    idle > allowance + self.abort_after:
                self.on_abort(phase, idle)

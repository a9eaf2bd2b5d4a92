"""What one rank finds reaches the others at once, off the training step.

Under DDP each rank sees its own faults: a loss term that vanished on rank
3, a MACL loss that is missing there, a loader that fell back to
``num_workers=0``, an exception in rank 3's data pipeline. MMEngine prints
only rank 0's log, and such a fault often ends the run before mmsafe's
next monitoring sync (:class:`~mmsafe.engine.monitor_sync.MonitorSync`):
DDP's unused-parameter error comes one iteration after a loss term
vanished, and a rank that raises leaves the others waiting in a
collective (with NCCL until the distributed timeout).

:class:`RankChannel` is a side channel through the rendezvous TCP store of
the process group (``torchrun``'s agent store, or the store that rank 0
serves when ranks are started without the agent, as ``srun`` does), over a
connection of its own:

* a rank writes a record only when it has something to say (the message
  of an event, :func:`mmsafe.events.write_event`, which a log handler of
  the channel picks up from the run's logger; its exception; its end;
  :class:`~mmsafe.engine.hooks.RankFaultHook` also
  stores the rank's loss terms at the first iteration and when they
  change); a healthy training step writes nothing and runs no collective;
* every rank has a listener thread that blocks in one store ``wait`` for
  the next record, which the store answers when a record arrives;
* rank 0's listener logs the findings of the other ranks, naming the rank
  and iteration, on rank 0's console and in its log;
* a record of a rank's exception (``fatal``) reaches every rank: rank 0
  logs it and hands it to the run's crash report, and every rank that is
  still inside its run ``grace`` seconds later ends its process with
  :data:`PEER_FAILURE_EXIT_CODE` instead of waiting out the distributed
  timeout. The same holds when the store itself goes away without a word
  from its host (rank 0 killed).

Records are numbered by the store (``add('seq', 1)``) and read in that
order by every listener. Keys live under ``mmsafe/channel/<attempt>/``, so
a run that ``torchrun`` restarts does not read the records of the attempt
before.
"""
import json
import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional

from mmsafe.compat import default_store_address
from mmsafe.events import EVENT_ATTR, LOG_PREFIX, log

#: Exit code of a rank that ends itself because another rank failed.
PEER_FAILURE_EXIT_CODE = 1

#: Seconds a rank may go on after another rank failed (to fail on its own,
#: with its own message) before it ends itself.
DEFAULT_PEER_GRACE = 10.0

FINDING = 'finding'
FATAL = 'fatal'
CLOSED = 'closed'

_LONG_WAIT = timedelta(days=7)


def failed_party(record: Dict[str, Any]) -> str:
    """Who a failure record (``publish_failure``) is about: ``'rank R'``,
    or ``'the rendezvous store'`` when it names no rank."""
    failed = record.get('rank')
    return 'the rendezvous store' if failed is None else f'rank {failed}'


def failure_place(record: Dict[str, Any]) -> str:
    """Where the failure of ``record`` happened, for a log line:
    ``' in iteration N'``, or ``''`` when unknown."""
    it = record.get('iter')
    return '' if it is None else f' in iteration {it}'


def _is_power_of_two(count: int) -> bool:
    return count > 0 and count & (count - 1) == 0


class RankChannel:
    """The side channel of one process (see the module docstring).

    Args:
        rank (int): this process's rank.
        world_size (int): number of ranks.
        grace (float): seconds before a rank that is still inside its run
            ends itself after another rank failed; <= 0 never.
        on_peer_failure (callable, optional): called in the listener thread
            with the record of another rank's failure (once per record).
        before_exit (callable, optional): called in the listener thread with
            that record right before the process ends itself.
    """

    def __init__(self, rank: int, world_size: int,
                 grace: float = DEFAULT_PEER_GRACE,
                 on_peer_failure: Optional[Callable[[Dict], None]] = None,
                 before_exit: Optional[Callable[[Dict], None]] = None
                 ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.grace = grace
        self.on_peer_failure = on_peer_failure
        self.before_exit = before_exit
        self.active = False  # inside train/val/test
        self.peer_failures: List[Dict] = []
        self.closed_ranks: set = set()
        self.address: Optional[tuple] = None
        self._store = None
        self._wait_store = None
        self._listener: Optional[threading.Thread] = None
        self._timer: Optional[threading.Timer] = None
        self._closing = False
        self._shared: Dict[str, int] = {}
        self._lock = threading.Lock()
        self._logger: Optional[logging.Logger] = None
        self._forwarder: Optional[logging.Handler] = None

    # ------------------------------------------------------------ set-up --
    def open(self, logger: Optional[logging.Logger] = None) -> bool:
        """Connect to the process group's TCP store and start listening.

        Args:
            logger (logging.Logger, optional): the run's logger (MMEngine's
                ``runner.logger``): the message of an event logged there
                (:func:`mmsafe.events.write_event`) is forwarded to rank 0
                until :meth:`close`.

        Returns:
            bool: False (and logged once) when the process group has no TCP
            store; findings then reach rank 0 at the next monitoring sync.
        """
        address = default_store_address()
        if address is None:
            log('the process group has no TCP rendezvous store, so findings '
                'of other ranks reach rank 0 at the next monitoring sync '
                'only, and a failed rank is noticed at the next collective.',
                logging.INFO)
            return False
        try:
            self._store = _connect(address)
            # The listener blocks in its wait: it gets a connection of its
            # own, so that writes from the main thread never queue behind it.
            self._wait_store = _connect(address)
        except RuntimeError as err:
            # Training itself does not need the channel: said, not raised.
            self._store = self._wait_store = None
            log(f'rank {self.rank} could not connect to the rendezvous '
                f'store at {address[0]}:{address[1]} ({type(err).__name__}: '
                f'{err}); findings of this rank reach rank 0 at the next '
                'monitoring sync only.', logging.WARNING)
            return False
        self.address = address
        self._listener = threading.Thread(
            target=self._listen, name='mmsafe-rank-channel', daemon=True)
        self._listener.start()
        if logger is not None:
            self._forwarder = _EventForwarder(self)
            self._logger = logger
            logger.addHandler(self._forwarder)
        return True

    def close(self) -> None:
        """Say that this rank ended normally and stop listening."""
        if self._logger is not None:
            self._logger.removeHandler(self._forwarder)
            self._logger = None
        if self._store is None or self._closing:
            return
        self._closing = True
        self.active = False
        if self._timer is not None:
            self._timer.cancel()
        try:
            self._publish(dict(kind=CLOSED))
        except RuntimeError:
            # The store's host ended first (its run is over too); the
            # listener thread is a daemon and ends with the process.
            return
        if self._listener is not None:
            self._listener.join(timeout=5)

    # ---------------------------------------------------------- writing --
    def _publish(self, record: Dict[str, Any]) -> None:
        record = dict(record, rank=self.rank, time=time.time())
        text = json.dumps(record, default=str)
        with self._lock:
            seq = self._store.add('seq', 1)
            self._store.set(f'rec/{seq}', text)

    def share(self, kind: str, message: str, level: int = logging.WARNING,
              iteration: Optional[int] = None, **fields: Any) -> None:
        """Send a rank-local finding (``kind``: what was found, the
        event's kind) to rank 0's console and log; nothing happens on rank
        0 or without a store. Repeats of one ``kind`` are forwarded at
        their 1st, 2nd, 4th, 8th, ... occurrence on this rank (with the
        count), so a frequent one costs a handful of store writes."""
        if self.rank == 0 or self._store is None or self._closing:
            return
        count = self._shared.get(kind, 0) + 1
        self._shared[kind] = count
        if not _is_power_of_two(count):
            return
        try:
            self._publish(dict(kind=FINDING, what=kind, message=message,
                               level=level, iter=iteration, count=count,
                               fields=fields))
        except RuntimeError as err:
            log(f'rank {self.rank} could not forward a finding to rank 0 '
                f'({type(err).__name__}: {err}); it is in this rank\'s '
                'events file.', logging.WARNING)

    def publish_failure(self, record: Dict[str, Any]) -> None:
        """Tell every rank that this rank failed (its exception and what
        mmsafe knows about it). A store that cannot be reached is logged;
        the caller raises its exception anyway."""
        if self._store is None or self._closing:
            return
        try:
            self._publish(dict(record, kind=FATAL))
        except RuntimeError as err:
            log(f'rank {self.rank} could not tell the other ranks about its '
                f'failure ({type(err).__name__}: {err}).', logging.WARNING)

    def set_value(self, key: str, value: Any) -> None:
        """Store a JSON value under ``key`` for the other ranks to read
        (a store that cannot be reached is logged: the value is then
        missing from explanations, nothing else changes)."""
        if self._store is None or self._closing:
            return
        try:
            self._store.set(f'val/{key}', json.dumps(value, default=str))
        except RuntimeError as err:
            log(f'rank {self.rank} could not store {key!r} for the other '
                f'ranks ({type(err).__name__}: {err}).', logging.WARNING)

    def get_value(self, key: str, timeout: float = 2.0) -> Any:
        """The JSON value another rank stored under ``key``, or None when
        there is none within ``timeout`` seconds."""
        if self._store is None:
            return None
        try:
            self._store.wait([f'val/{key}'], timedelta(seconds=timeout))
            return json.loads(self._store.get(f'val/{key}'))
        except RuntimeError:
            return None

    def wait_for_peer_failure(self, timeout: float) -> Optional[Dict]:
        """The first failure record of another rank, waiting up to
        ``timeout`` seconds for one to arrive."""
        deadline = time.monotonic() + timeout
        while not self.peer_failures and self._store is not None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.peer_failures[0] if self.peer_failures else None

    # -------------------------------------------------------- listening --
    def _listen(self) -> None:
        seq = 0
        while True:
            seq += 1
            key = f'rec/{seq}'
            try:
                self._wait_store.wait([key], _LONG_WAIT)
                record = json.loads(self._wait_store.get(key))
            except RuntimeError as err:
                if self._closing:
                    return
                seq -= 1
                if 'timeout' in str(err).lower():
                    continue
                self._store_lost(err)
                return
            if record.get('rank') == self.rank:
                if record.get('kind') == CLOSED:
                    return
                continue
            self._dispatch(record)

    def _dispatch(self, record: Dict[str, Any]) -> None:
        kind = record.get('kind')
        if kind == CLOSED:
            self.closed_ranks.add(record.get('rank'))
        elif kind == FINDING and self.rank == 0:
            count = record.get('count', 1)
            again = f' [occurrence {count} on that rank]' if count > 1 \
                else ''
            log(f'[from rank {record.get("rank")}] {record.get("message")}'
                f'{again}', int(record.get('level', logging.WARNING)))
        elif kind == FATAL:
            self._peer_failed(record)

    def _store_lost(self, err: BaseException) -> None:
        others = set(range(self.world_size)) - {self.rank}
        if others <= self.closed_ranks or not self.active:
            return
        host, port = self.address or ('?', '?')
        self._peer_failed(dict(
            kind=FATAL, rank=None, iter=None, lost_store=True,
            type='ConnectionError',
            message=(f'the rendezvous store at {host}:{port} went away '
                     f'({err}): the process that serves it (rank 0, or '
                     'torchrun\'s agent) ended without a word, e.g. killed '
                     'by a signal or the out-of-memory killer')))

    def _peer_failed(self, record: Dict[str, Any]) -> None:
        self.peer_failures.append(record)
        if self.on_peer_failure is not None:
            try:
                self.on_peer_failure(record)
            except Exception as err:  # noqa: BLE001 (listener thread)
                log(f'handling the failure of rank {record.get("rank")} '
                    f'failed: {type(err).__name__}: {err}', logging.ERROR)
        if self.grace > 0 and self._timer is None:
            self._timer = threading.Timer(self.grace, self._end_process,
                                          args=(record, ))
            self._timer.daemon = True
            self._timer.start()

    def _end_process(self, record: Dict[str, Any]) -> None:
        if not self.active:
            return  # the main thread left its run (failing on its own)
        log(f'rank {self.rank} ends its process (exit code '
            f'{PEER_FAILURE_EXIT_CODE}): {failed_party(record)} failed '
            f'{self.grace:g} s ago '
            'and this rank is still inside its run (waiting for the failed '
            'rank in a collective, or busy without it); waiting out the '
            'distributed timeout would change nothing.', logging.ERROR)
        if self.before_exit is not None:
            try:
                self.before_exit(record)
            except Exception as err:  # noqa: BLE001 (the process ends)
                log(f'the crash report before ending failed: '
                    f'{type(err).__name__}: {err}', logging.ERROR)
        for handler in logging.getLogger().handlers + _mm_handlers():
            try:
                handler.flush()
            except (OSError, ValueError):  # a closed stream: nothing to do
                continue
        os._exit(PEER_FAILURE_EXIT_CODE)


def end_process_after(channel: Optional[RankChannel],
                      seconds: float) -> None:
    """After an error that ends a distributed run: make sure this process
    is gone within ``seconds``, even when its shutdown hangs (a worker or
    communication thread that does not end), so that the other ranks are
    not kept waiting for it. A daemon timer; nothing happens when the
    process exits on its own first, or without a ``channel`` (the run's,
    ``run_context(runner).rank_channel``)."""
    if channel is None or seconds <= 0:
        return

    def _end() -> None:
        log(f'this process was still alive {seconds:g} s after its error '
            f'(its shutdown hangs): ending it (exit code '
            f'{PEER_FAILURE_EXIT_CODE}).', logging.ERROR)
        os._exit(PEER_FAILURE_EXIT_CODE)

    timer = threading.Timer(seconds, _end)
    timer.daemon = True
    timer.start()


class _EventForwarder(logging.Handler):
    """Forwards the log records of events' messages (those that carry
    :data:`mmsafe.events.EVENT_ATTR`) to rank 0 through ``channel``."""

    def __init__(self, channel: RankChannel) -> None:
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        kind = getattr(record, EVENT_ATTR, None)
        if kind is None:
            return
        message = record.getMessage()
        if message.startswith(LOG_PREFIX):
            message = message[len(LOG_PREFIX):]
        self.channel.share(kind, message, record.levelno,
                           getattr(record, 'mmsafe_iter', None))


def _connect(address: tuple):
    import torch.distributed as dist
    host, port = address
    client = dist.TCPStore(host, port, is_master=False,
                           timeout=timedelta(seconds=15))
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    return dist.PrefixStore(f'mmsafe/channel/{attempt}/', client)


def _mm_handlers() -> list:
    from mmengine.logging import MMLogger
    return list(MMLogger.get_current_instance().handlers)

"""Monitoring values of mmsafe's hooks, summed over ranks at the log
interval in ONE small collective.

A healthy training step of a DDP run communicates only through DDP's own
gradient all-reduce: mmsafe's step decisions are taken locally from values
that this reduce already made identical on every rank (see
:class:`~mmsafe.engine.optimizers.NaNSkipOptimWrapper`). What mmsafe's
hooks watch (empty batches, the MACL loss, stop requests of scalar bands,
loss-dict findings) is *monitoring*: each rank ``post``s its values locally
every iteration, and the values travel together at the logger's interval
(every ``LoggerHook.interval`` iterations and at the last iteration), in a
single fixed-size all-reduce. Every rank then sees the same sums and takes
the same decision (warn, raise, stop) at the same iteration. In a single
process there is nothing to communicate: the sums are "reduced" every
iteration, for free.

Usage in a hook::

    from mmsafe.engine.monitor_sync import monitor_sync_of

    sync = monitor_sync_of(runner)         # in before_run
    sync.declare('empty_batch')            # in before_run, on every rank
    ...
    sync.post('empty_batch', 1.0)          # any iteration, local
    if sync.sync(runner):                  # after_train_iter, every rank
        sync.last('empty_batch')           # SUM over ranks and iterations
                                           # since the previous sync

It is the one way mmsafe's hooks share a value across ranks; a decision
that cannot wait for the log interval (an opt-in's) sums at once with
:meth:`MonitorSync.sum_now`, at the price of a collective of its own.

Rules that keep ranks in step:

* every rank must know the same names when a sync happens: ``declare``
  names in ``before_run`` (all ranks build the same hooks from the same
  config). A mismatch is detected inside the same collective and raises the
  same error on every rank instead of mixing up values;
* ``sync`` is called by hooks in ``after_train_iter`` on every rank; whether
  an iteration syncs depends only on the iteration number, the logger
  interval and the run length, identical on every rank. Under DDP the
  first call of an iteration runs the collective and later calls in the
  same iteration read its result (values posted after it travel with the
  next sync, alike on every rank: hooks run in the same order everywhere).
  In a single process every call publishes what was posted since the
  previous one;
* nothing here returns early before a collective.
"""
import zlib
from typing import Dict, List, Optional, Sequence

from mmsafe.dist import (all_reduce_sum, get_rank, get_world_size,
                         is_distributed)
from mmsafe.engine.run_context import run_context
from mmsafe.errors import MMSafeKeyError, MMSafeRuntimeError

#: Capacity of the sync vector. The collective has a fixed size so that
#: ranks which disagree on names still meet in the same all-reduce (and then
#: raise) rather than hang on mismatched shapes.
MAX_NAMES = 64

#: Up to this world size the sync also tells which ranks posted a non-zero
#: value for a name (a sum of ``2 ** rank`` stays exact in float64).
MAX_RANKS_NAMED = 52

#: Sync interval when the runner has no LoggerHook.
DEFAULT_INTERVAL = 50


def _fingerprint(names: Sequence[str]) -> float:
    return float(zlib.crc32('\n'.join(names).encode('utf-8')))


def logger_interval(runner, default: int = DEFAULT_INTERVAL) -> int:
    """The ``interval`` of the runner's ``LoggerHook`` (its log interval)."""
    from mmengine.hooks import LoggerHook
    for hook in getattr(runner, 'hooks', []):
        if isinstance(hook, LoggerHook):
            return max(1, int(hook.interval))
    return default


class MonitorSync:
    """Store of the monitoring values that mmsafe hooks post,
    summed over ranks at the log interval in one collective.

    :class:`~mmsafe.engine.runner.SafeRunner` puts one in the run context
    for all of mmsafe's hooks (:func:`monitor_sync_of`). See the module
    docstring for the rules.

    Args:
        interval (int, optional): iterations between syncs under DDP. None
            takes the runner's ``LoggerHook.interval`` at the first sync.
    """

    def __init__(self, interval: Optional[int] = None) -> None:
        self.interval = interval
        self._names: List[str] = []  # sorted
        self._values: Dict[str, float] = {}
        self._counts: Dict[str, int] = {}
        self._last_values: Dict[str, float] = {}
        self._last_counts: Dict[str, int] = {}
        self._last_ranks: Dict[str, Optional[List[int]]] = {}
        self._last_sync_iter: Optional[int] = None
        self.num_syncs = 0
        self.num_collectives = 0

    # ------------------------------------------------------------------ #
    def declare(self, name: str) -> None:
        """Make ``name`` known on this rank (call it on every rank)."""
        if name in self._names:
            return
        if len(self._names) >= MAX_NAMES:
            raise MMSafeRuntimeError(
                f'[mmsafe] MonitorSync holds at most {MAX_NAMES} names; '
                f'cannot declare {name!r}. Known: {self._names}')
        self._names = sorted(self._names + [name])

    def post(self, name: str, value: float = 1.0) -> None:
        """Add ``value`` to ``name`` until the next sync (local, free).

        Args:
            name (str): a declared name.
            value (float): what to add (a Python number: posting never
                reads a device tensor).
        """
        if name not in self._names:
            raise MMSafeKeyError(
                f'[mmsafe] MonitorSync: {name!r} was not declared; declare '
                'it in the hook\'s before_run so that every rank knows it')
        self._values[name] = self._values.get(name, 0.0) + float(value)
        self._counts[name] = self._counts.get(name, 0) + 1

    def pending(self, name: str) -> float:
        """This rank's posted, not yet synced, sum for ``name``."""
        return self._values.get(name, 0.0)

    # ------------------------------------------------------------------ #
    def due(self, runner) -> bool:
        """Whether this training iteration syncs (same answer on every
        rank): every iteration in a single process; under DDP every
        ``interval`` iterations and at the last iteration of the run."""
        if not is_distributed():
            return True
        if self.interval is None:
            self.interval = logger_interval(runner)
        done = runner.iter + 1
        max_iters = getattr(runner, 'max_iters', None)
        return done % self.interval == 0 or (max_iters is not None
                                             and done >= max_iters)

    def sync(self, runner) -> bool:
        """Sum the posted values over ranks when this iteration is due
        (collective under DDP: call it on every rank, in
        ``after_train_iter``).

        Returns:
            bool: True when the values of :meth:`last` are fresh from this
            iteration's sync; False when this iteration does not sync.
        """
        if not is_distributed():
            # Nothing to communicate: every call publishes what was posted
            # since the previous call, so each hook reads its own values of
            # this iteration.
            self.reduce()
            return True
        it = runner.iter
        if self._last_sync_iter == it:
            return True
        if not self.due(runner):
            return False
        self.reduce()
        self._last_sync_iter = it
        return True

    def reduce(self) -> Dict[str, float]:
        """Sum everything posted since the last sync over all ranks
        (collective under DDP: every rank must call it at the same point).

        Returns:
            dict: the summed value per name.

        Raises:
            RuntimeError: on every rank, when ranks know different names.
        """
        names = list(self._names)
        size = len(names)
        vector = [0.0] * (2 + 3 * MAX_NAMES)
        vector[0] = _fingerprint(names)
        vector[1] = float(size)
        distributed = is_distributed()
        world_size = get_world_size() if distributed else 1
        rank = get_rank() if distributed else 0
        named = world_size <= MAX_RANKS_NAMED
        for i, name in enumerate(names):
            vector[2 + i] = self._values.get(name, 0.0)
            vector[2 + MAX_NAMES + i] = float(self._counts.get(name, 0))
            if named and self._values.get(name, 0.0) != 0.0:
                vector[2 + 2 * MAX_NAMES + i] = float(2**rank)
        reduced = all_reduce_sum(vector)
        self.num_collectives += int(distributed)
        self._values.clear()
        self._counts.clear()
        self.num_syncs += 1
        if (reduced[0] != world_size * vector[0]
                or reduced[1] != world_size * vector[1]):
            raise MMSafeRuntimeError(
                '[mmsafe] MonitorSync: ranks declared different value names '
                f'(rank {get_rank()} knows {names}). Every rank must build '
                'the same mmsafe hooks from the same config.')
        self._last_values = {
            name: reduced[2 + i]
            for i, name in enumerate(names)
        }
        self._last_counts = {
            name: int(reduced[2 + MAX_NAMES + i])
            for i, name in enumerate(names)
        }
        self._last_ranks = {
            name: ([r for r in range(world_size)
                    if int(reduced[2 + 2 * MAX_NAMES + i]) >> r & 1]
                   if named else None)
            for i, name in enumerate(names)
        }
        return dict(self._last_values)

    @staticmethod
    def sum_now(value: float) -> float:
        """``value`` summed over the ranks at once, for a decision that
        cannot wait for the next sync (an opt-in's every-iteration check, a
        verdict after a validation): one all-reduce of one float under DDP
        (call it on every rank at the same point), ``value`` itself in a
        single process. Nothing posted is touched."""
        return all_reduce_sum([float(value)])[0]

    def rewound(self) -> None:
        """Forget which iteration synced last: the run's iteration count
        was set back (a rollback), so iteration numbers come again and
        each must sync afresh. Call it on every rank alike."""
        self._last_sync_iter = None

    def last(self, name: str, default: float = 0.0) -> float:
        """Summed value of ``name`` at the latest sync."""
        return self._last_values.get(name, default)

    def last_ranks(self, name: str) -> Optional[List[int]]:
        """The ranks that posted a non-zero value for ``name`` since the
        sync before the latest (None above :data:`MAX_RANKS_NAMED`
        ranks)."""
        return self._last_ranks.get(name, [])

    def last_count(self, name: str) -> int:
        """How many posts (all ranks together) ``last(name)`` summed."""
        return self._last_counts.get(name, 0)


def monitor_sync_of(runner) -> MonitorSync:
    """The :class:`MonitorSync` a hook posts to during ``runner``'s run.

    It is the ``monitor_sync`` of the run's context
    (:func:`~mmsafe.engine.run_context.run_context`):
    :class:`~mmsafe.engine.runner.SafeRunner` (``runner_type='SafeRunner'``,
    set by ``configs/_base_/safety_runtime.py``) puts one there that all of
    mmsafe's hooks share: under DDP their values travel in one all-reduce
    per log interval. Under any other runner the context has none; then
    each calling hook gets a new instance of its own (call this once, in
    ``before_run``, and keep the result): the values travel in one
    all-reduce per hook and log interval.

    Args:
        runner: the runner the hook is registered in.

    Returns:
        MonitorSync: the run's instance, or a new one for the caller.
    """
    sync = run_context(runner).monitor_sync
    return sync if isinstance(sync, MonitorSync) else MonitorSync()

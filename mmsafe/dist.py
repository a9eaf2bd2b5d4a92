"""Step consensus: every mmsafe decision of one optimizer step, taken by all
ranks together in ONE small collective.

Why one collective: under DDP a guard that decides alone (say, "my loss is
NaN, skip") makes its rank skip the optimizer step, or return early, while
the other ranks step; parameters drift apart or a later collective waits
forever. A guard that all-reduces its own flag is correct but costs one
collective per guard per step. mmsafe guards instead ``post`` what they
know; mmsafe's optim wrappers reduce every posted value in a single
``all_reduce`` at the accumulation boundary, and then every rank sees the
same numbers and takes the same decision.

Usage in a guard::

    from mmsafe.dist import StepConsensus

    consensus = StepConsensus.get()
    consensus.declare('empty_batch', skip_when='all')  # in __init__
    ...
    consensus.post('empty_batch', 1.0 if empty else 0.0)  # before the step
    ...
    StepConsensus.get().reduce_pending()  # in after_train_iter: a no-op
    # when an mmsafe optim wrapper reduced at the step, else one reduce
    StepConsensus.get().last('empty_batch')  # SUM over ranks (and over the
    # micro-iterations of an accumulation window)

Rules that keep ranks in step:

* every rank must know the same names when a reduce happens: ``declare``
  names in ``__init__`` (all ranks build the same hooks from the same
  config) or ``post`` them on every rank, every iteration (0.0 when there
  is nothing to report). A mismatch is detected inside the same collective
  and raises the same error on every rank instead of mixing up values;
* posting the same name twice before a reduce adds the values (flags of
  an accumulation window add up); the reduced ``count`` says how many
  posts were summed over all ranks;
* nothing here returns early before a collective: ``reduce`` always runs
  the all-reduce on every rank, even with nothing posted.
"""
import logging
import math
import zlib
from typing import Any, Dict, List, Optional, Sequence

import torch

#: Capacity of the consensus vector. The collective has a fixed size so that
#: ranks which disagree on names still meet in the same all-reduce (and then
#: raise) rather than hang on mismatched shapes.
MAX_NAMES = 64

_SKIP_RULES = ('any', 'all')


def get_rank() -> int:
    """Rank of this process (0 when not distributed)."""
    from mmengine.dist import get_rank as _get_rank
    return _get_rank()


def get_world_size() -> int:
    """Number of processes (1 when not distributed)."""
    from mmengine.dist import get_world_size as _get_world_size
    return _get_world_size()


def is_distributed() -> bool:
    """Whether a default process group with more than one rank exists."""
    from mmengine.dist import is_distributed as _is_distributed
    return _is_distributed() and get_world_size() > 1


def all_reduce_sum(values: Sequence[float]) -> List[float]:
    """Sum a short list of floats over all ranks in one collective.

    float64 keeps integer counts and CRC fingerprints (< 2**32) exact.

    Args:
        values (Sequence[float]): this rank's values; every rank must pass
            the same number of values.

    Returns:
        list[float]: the element-wise sums (the input when not distributed).
    """
    if not is_distributed():
        return [float(v) for v in values]
    import torch.distributed as torch_dist
    from mmengine.dist import get_comm_device
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64,
                          device=get_comm_device())
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor.cpu().tolist()


def all_gather_object(obj: Any) -> List[Any]:
    """Gather a picklable object from every rank (``[obj]`` when single)."""
    if not is_distributed():
        return [obj]
    from mmengine.dist import all_gather_object as _all_gather_object
    return _all_gather_object(obj)


def current_iter() -> Optional[int]:
    """The runner's current iteration from the message hub, if any."""
    from mmengine.logging import MessageHub
    try:
        hub = MessageHub.get_current_instance()
    except Exception:  # pragma: no cover - no hub can be created
        return None
    value = hub.get_info('iter', None)
    return None if value is None else int(value)


def _fingerprint(names: Sequence[str]) -> float:
    return float(zlib.crc32('\n'.join(names).encode('utf-8')))


class StepConsensus:
    """Per-process store of the values that mmsafe guards post before an
    optimizer step, reduced with SUM across ranks in one collective.

    Get the process-wide instance with :meth:`get`; do not construct it in
    guards. See the module docstring for the rules.
    """

    _instance: Optional['StepConsensus'] = None

    def __init__(self) -> None:
        self._names: List[str] = []  # sorted
        self._skip_rules: Dict[str, str] = {}
        self._values: Dict[str, float] = {}
        self._counts: Dict[str, int] = {}
        self._last_values: Dict[str, float] = {}
        self._last_counts: Dict[str, int] = {}
        self._last_skip_reasons: List[str] = []
        self._last_reduced_iter: Optional[int] = None
        self._owner: Optional[str] = None
        self.num_reduces = 0

    # ------------------------------------------------------------------ #
    # process-wide instance
    @classmethod
    def get(cls) -> 'StepConsensus':
        """The consensus object of this process (created on first use)."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    @classmethod
    def reset(cls) -> None:
        """Forget the process-wide instance (tests, or a second run)."""
        cls._instance = None

    # ------------------------------------------------------------------ #
    # who reduces
    def attach_optim_wrapper(self, name: str) -> None:
        """Called by mmsafe's optim wrappers: from now on they reduce at the
        accumulation boundary and :meth:`reduce_pending` does nothing."""
        self._owner = name

    @property
    def managed(self) -> bool:
        """Whether an mmsafe optim wrapper reduces at every step."""
        return self._owner is not None

    # ------------------------------------------------------------------ #
    # posting
    def declare(self, name: str, skip_when: Optional[str] = None) -> None:
        """Make ``name`` known on this rank (call it on every rank).

        Args:
            name (str): the value's name.
            skip_when (str, optional): ``'any'``: mmsafe's optim wrappers
                skip the step when the reduced sum is non-zero (some post on
                some rank was non-zero). ``'all'``: they skip when every
                post of the step, on every rank, was non-zero (e.g. every
                rank's batch was empty). None: the value is only carried.
        """
        if skip_when is not None and skip_when not in _SKIP_RULES:
            raise ValueError(f'skip_when must be one of {_SKIP_RULES} or '
                             f'None, got {skip_when!r}')
        if name not in self._names:
            if len(self._names) >= MAX_NAMES:
                raise RuntimeError(
                    f'[mmsafe] StepConsensus holds at most {MAX_NAMES} names; '
                    f'cannot declare {name!r}. Known: {self._names}')
            self._names = sorted(self._names + [name])
        if skip_when is not None:
            self._skip_rules[name] = skip_when

    def post(self, name: str, value: float = 1.0) -> None:
        """Add ``value`` to ``name`` for the coming reduce.

        Args:
            name (str): the value's name; declared on first use (then every
                rank must post it before the same reduce).
            value (float): what to add. Flags are 0.0 or 1.0.
        """
        self.declare(name)
        self._values[name] = self._values.get(name, 0.0) + float(value)
        self._counts[name] = self._counts.get(name, 0) + 1

    def pending(self, name: str) -> float:
        """This rank's posted, not yet reduced, sum for ``name``."""
        return self._values.get(name, 0.0)

    # ------------------------------------------------------------------ #
    # reducing
    def reduce(self) -> Dict[str, float]:
        """All-reduce everything posted since the last reduce (collective:
        every rank must call it at the same point).

        Returns:
            dict: reduced sum per name.

        Raises:
            RuntimeError: on every rank, when ranks know different names.
        """
        names = list(self._names)
        size = len(names)
        vector = [0.0] * (2 + 2 * MAX_NAMES)
        vector[0] = _fingerprint(names)
        vector[1] = float(size)
        for i, name in enumerate(names):
            vector[2 + i] = self._values.get(name, 0.0)
            vector[2 + MAX_NAMES + i] = float(self._counts.get(name, 0))
        world_size = get_world_size() if is_distributed() else 1
        reduced = all_reduce_sum(vector)
        self._values.clear()
        self._counts.clear()
        self.num_reduces += 1
        self._last_reduced_iter = current_iter()
        if (reduced[0] != world_size * vector[0]
                or reduced[1] != world_size * vector[1]):
            raise RuntimeError(
                '[mmsafe] StepConsensus: ranks posted different value names '
                f'before the same step (rank {get_rank()} knows {names}). '
                'Declare every name on every rank in the guard\'s __init__ '
                '(StepConsensus.get().declare(name)) or post it on every '
                'rank each iteration (0.0 when there is nothing to report).')
        self._last_values = {
            name: reduced[2 + i]
            for i, name in enumerate(names)
        }
        self._last_counts = {
            name: int(reduced[2 + MAX_NAMES + i])
            for i, name in enumerate(names)
        }
        self._last_skip_reasons = self._evaluate_skip_rules()
        return dict(self._last_values)

    def reduce_pending(self) -> Optional[Dict[str, float]]:
        """Reduce once for the current iteration when no mmsafe optim
        wrapper does it at the step (collective: call it on every rank).

        Several hooks may call it in the same ``after_train_iter``: only the
        first one reduces. With an mmsafe optim wrapper active it does
        nothing, because the wrapper already reduced at the step (or will,
        at the end of the accumulation window).

        Returns:
            dict or None: the reduced values, or None when nothing was done.
        """
        if self.managed:
            return None
        it = current_iter()
        if it is not None and it == self._last_reduced_iter:
            return None
        return self.reduce()

    def last(self, name: str, default: float = 0.0) -> float:
        """Reduced sum of ``name`` at the latest reduce."""
        return self._last_values.get(name, default)

    def last_count(self, name: str) -> int:
        """How many posts (all ranks together) the latest ``last(name)``
        summed."""
        return self._last_counts.get(name, 0)

    def last_skip_reasons(self) -> List[str]:
        """Names whose skip rule fired at the latest reduce."""
        return list(self._last_skip_reasons)

    def _evaluate_skip_rules(self) -> List[str]:
        reasons = []
        for name, rule in sorted(self._skip_rules.items()):
            value = self._last_values.get(name, 0.0)
            count = self._last_counts.get(name, 0)
            if rule == 'any':
                fire = value != 0.0 or math.isnan(value)
            else:
                fire = count > 0 and value >= count
            if fire:
                reasons.append(name)
        return reasons


def log_once(key: str, message: str, level: int = logging.WARNING,
             _seen=set()) -> None:  # noqa: B006 (process-wide memo)
    """Log ``message`` through MMEngine's logger the first time ``key`` is
    seen in this process."""
    if key in _seen:
        return
    _seen.add(key)
    from mmengine.logging import print_log
    print_log(message, logger='current', level=level)

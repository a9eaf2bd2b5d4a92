"""Signals of a cross-modal contrastive (MACL) loss read from its logged
values, as :class:`~mmsafe.engine.hooks.MACLCheckHook` judges them:
liveness, reach into the head, chance level, and windows over which they
are averaged."""
import math
from typing import Dict, List, Optional, Sequence, Tuple

#: Problems of the loss itself, checked every iteration on every rank.
PROBLEMS = ('missing', 'nonfinite', 'zero', 'constant', 'unreached')
#: The problems judged per loss term (``unreached`` is the head's).
TERM_PROBLEMS = PROBLEMS[:4]
DESCRIBE = dict(
    missing='is missing from the loss dict',
    nonfinite='is not finite',
    zero='is exactly 0 with >= 2 pairs to contrast (loss_weight=0 or a '
    'detached fallback)',
    constant='has not changed for {n} iterations (a constant or detached '
    'fallback)',
    unreached='no longer reaches the MACL head: its parameters did not '
    'change while the rest of the model trained (a detached loss)')


def find_macl_head(model, path: Optional[str] = None):
    """The module at attribute path ``path`` of ``model`` (e.g.
    ``'macl_head'``), or without a path the first submodule with a
    ``last_num_pairs`` attribute (None when there is none)."""
    if path:
        head = model
        for part in path.split('.'):
            head = getattr(head, part)
        return head
    for module in model.modules():
        if hasattr(module, 'last_num_pairs'):
            return module
    return None


def describe(loss_key: str, found: Dict, seen: int,
             constant_iters: int) -> str:
    """One clause per problem: what, and in how many rank-iterations of
    ``seen``.

    Args:
        loss_key (str): the term a problem is of when ``found`` is keyed by
            problem alone.
        found (dict): problem -> count, or ``(term, problem)`` -> count.
        seen (int): rank-iterations judged.
        constant_iters (int): the length of a constant streak.
    """
    clauses = []
    for key, count in found.items():
        term, name = key if isinstance(key, tuple) else (loss_key, key)
        clauses.append(f'{term} ' + DESCRIBE[name].format(n=constant_iters)
                       + f' ({count} of {seen} rank-iterations)')
    return '; '.join(clauses)


class LossLiveness:
    """The local problems of a loss from its value, iteration by iteration:
    missing (None), not finite, exactly zero while a contrast was possible
    (``ratio`` known), or the same non-zero value ``constant_iters`` times
    in a row.

    Args:
        constant_iters (int): Equal consecutive values that count as a
            constant loss (at least 2).
    """

    def __init__(self, constant_iters: int) -> None:
        self.constant_iters = max(2, constant_iters)
        self._last: Optional[float] = None
        self._same = 0

    def problems(self, value: Optional[float], ratio: Optional[float],
                 contrast_possible: Optional[bool] = None) -> List[str]:
        """Problem names (of :data:`PROBLEMS`) of this iteration's value.

        Args:
            value (float, optional): the logged value (None: missing).
            ratio (float, optional): its chance ratio, known when a
                contrast was possible.
            contrast_possible (bool, optional): whether a contrast was
                possible, for a term without a chance ratio (None: read it
                from ``ratio``). A zero is a problem only then.
        """
        if value is None:
            self._last, self._same = None, 0
            return ['missing']
        if not math.isfinite(value):
            return ['nonfinite']
        problems = []
        possible = ratio is not None if contrast_possible is None else \
            contrast_possible
        if value == 0.0 and possible:
            problems.append('zero')
        if value == self._last:
            self._same += 1
        else:
            self._last, self._same = value, 1
        if self._same >= self.constant_iters and value != 0.0:
            problems.append('constant')
        return problems


class HeadReach:
    """Whether a loss still reaches its head: a loss detached from the head
    leaves the head's parameters as they were while the rest of the model
    trains. In-place updates (optimizer steps) bump a tensor's version
    counter, so a change is seen without reading any value from the
    device.

    Args:
        head_params (list): Trainable parameters of the head.
        other_params (list): The model's other trainable parameters.
    """

    def __init__(self, head_params: Sequence, other_params: Sequence) -> None:
        self.head_params = list(head_params)
        self.other_params = list(other_params)
        self._versions: Optional[tuple] = None

    @staticmethod
    def _version(params) -> tuple:
        return tuple(p._version for p in params)

    def unreached(self) -> bool:
        """True when, since the previous call, the rest of the model
        changed and the head did not (False on the first call)."""
        if not self.head_params or not self.other_params:
            return False
        versions = (self._version(self.head_params),
                    self._version(self.other_params))
        previous, self._versions = self._versions, versions
        if previous is None:
            return False
        return versions[1] != previous[1] and versions[0] == previous[0]


def chance_ratio(value: float, num_pairs: Optional[int],
                 loss_weight: Optional[float]) -> Optional[float]:
    """Weighted InfoNCE ``value`` / ``loss_weight`` / ln(``num_pairs``):
    1.0 at chance level; None when it is undefined (fewer than 2 pairs or a
    zero weight). A None weight counts as 1."""
    weight = 1.0 if loss_weight is None else float(loss_weight)
    if not num_pairs or num_pairs < 2 or weight == 0:
        return None
    return value / weight / math.log(num_pairs)


class WindowMean:
    """Sums and counts accumulated over syncs until a window is full."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def add(self, total: float, count: float) -> None:
        self.total += total
        self.count += int(count)

    def take(self, size: int) -> Optional[Tuple[float, int]]:
        """``(mean, count)`` when at least ``size`` values were added (the
        window then restarts), else None."""
        if self.count < size or not self.count:
            return None
        taken = (self.total / self.count, self.count)
        self.total, self.count = 0.0, 0
        return taken

"""One expected band of a logged scalar (see
:class:`~mmsafe.engine.hooks.ScalarBandsHook`)."""
import fnmatch
import math
from typing import Optional

ACTIONS = ('warn', 'stop')
_STAGE_PREFIXES = ('train/', 'val/', 'test/')


class Band:
    """One expected band: which scalars, which range, what to do.

    Args:
        key (str): Scalar name or ``fnmatch`` pattern, matched against the
            message hub name with and without its stage prefix
            (``'grad_norm'`` matches ``'train/grad_norm'``;
            ``'pascal_voc/mAP'`` matches ``'val/pascal_voc/mAP'``;
            ``'loss*'`` matches every loss).
        min (float, optional): Lowest allowed value.
        max (float, optional): Highest allowed value.
        finite (bool): The value must be finite. A non-finite value also
            violates any ``min``/``max``. Defaults to False.
        after_iter (int): Active from training iteration ``after_iter + 1``
            (1-based, as in the log). Defaults to 0.
        after_epoch (int): Active once ``after_epoch`` epochs are complete.
            Defaults to 0.
        action (str): ``'warn'`` or ``'stop'``. Defaults to ``'warn'``.
        patience (int): Consecutive violating values before acting.
            Defaults to 1.
    """

    def __init__(self,
                 key: str,
                 min: Optional[float] = None,  # noqa: A002 (config name)
                 max: Optional[float] = None,  # noqa: A002
                 finite: bool = False,
                 after_iter: int = 0,
                 after_epoch: int = 0,
                 action: str = 'warn',
                 patience: int = 1) -> None:
        if action not in ACTIONS:
            raise ValueError(f'band {key!r}: action must be one of '
                             f'{ACTIONS}, got {action!r}')
        if min is None and max is None and not finite:
            raise ValueError(f'band {key!r} sets none of min, max, finite')
        if patience < 1:
            raise ValueError(f'band {key!r}: patience must be >= 1')
        self.key = key
        self.min = min
        self.max = max
        self.finite = finite
        self.after_iter = after_iter
        self.after_epoch = after_epoch
        self.action = action
        self.patience = patience

    def matches(self, name: str) -> bool:
        short = name
        for prefix in _STAGE_PREFIXES:
            if name.startswith(prefix):
                short = name[len(prefix):]
                break
        return (fnmatch.fnmatchcase(name, self.key)
                or fnmatch.fnmatchcase(short, self.key))

    def active(self, iteration: int, epoch: int) -> bool:
        """``iteration``: 1-based count of finished iterations; ``epoch``:
        finished epochs."""
        return iteration > self.after_iter and epoch >= self.after_epoch

    def violation(self, value: float) -> Optional[str]:
        """Why ``value`` is outside the band, or None."""
        if not math.isfinite(value):
            if self.finite or self.min is not None or self.max is not None:
                return 'is not finite'
            return None
        if self.min is not None and value < self.min:
            return f'is below min={self.min}'
        if self.max is not None and value > self.max:
            return f'is above max={self.max}'
        return None

    def describe(self) -> str:
        parts = []
        if self.min is not None:
            parts.append(f'min={self.min}')
        if self.max is not None:
            parts.append(f'max={self.max}')
        if self.finite:
            parts.append('finite')
        return f"{self.key} [{', '.join(parts)}]"

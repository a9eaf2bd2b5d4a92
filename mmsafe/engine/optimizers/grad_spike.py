"""Gradient-norm spikes: a step whose global gradient norm leaves the
rolling statistics of the recently applied steps.

The NaN-skip wrappers read the global gradient norm once per optimizer
step, after DDP's all-reduce made the gradients identical on every rank.
:class:`GradSpikeDetector` judges that one Python number against a rolling
window of the norms of recently *applied* steps, on the host: every rank
holds the same window and reaches the same verdict, with no collective and
no device read of its own.

Where the defaults come from:

* OLMo-core's ``SkipStepOptimizer`` skips a step whose loss or gradient
  norm is more than ``sigma_factor=6`` standard deviations from the mean of
  a rolling window of ``rolling_interval_length=128`` steps (judging from
  64 values on). Here: the same 6 standard deviations over 128 steps, but
  judged only above the mean, only once the window is full, and over
  applied steps only (a skipped spike never widens the window that judges
  the next one).
* Detection gradients are heavy-tailed: on mmsafe's healthy CPU demo
  (``benchmarks/grad_spikes.py``, 600 steps, five data orders) the norm of
  a healthy step reached 28 standard deviations and 13.8x the mean of the
  128 steps before it, and 6 standard deviations alone flagged 0-2 healthy
  steps per run. A spike must therefore also be ``min_ratio=20`` times the
  window's mean: a floor of the kind of Megatron-LM's rerun state machine,
  which flags a loss or gradient more than 10x the largest of its first
  100 values (``is_unexpectedly_large``, ``threshold=10``,
  ``num_samples=100``; the early values of a detector trained from scratch
  are its largest, so that reference never moves). A raw 16-bit infrared
  frame among 8-bit ones raises the norm 28x-5700x where the backbone's
  BatchNorm statistics are frozen (``norm_eval=True``, as in MMDetection's
  pretrained-backbone recipes); trainable BatchNorm absorbs most of it
  (0.1x-10x, not caught, and not a spike of the update either).
* LLM Foundry's ``KillLossSpike`` stops a run whose loss stays at twice
  its rolling mean (100 steps) for 5 steps in a row: a rule for a
  *diverging run*, which mmsafe applies in
  :class:`~mmsafe.engine.hooks.DivergenceRollbackHook`, not per step (the
  loss differs between ranks; judging it per step would cost one
  all-reduce per step).

A spike in the first ``window`` steps is not judged, and enters the
window as any applied step: it widens the statistics until it leaves.
"""
import math
from collections import deque
from typing import Any, Dict, Optional

from mmsafe.errors import MMSafeValueError

#: OLMo-core's rolling window (steps) and threshold (standard deviations).
DEFAULT_WINDOW = 128
DEFAULT_SIGMAS = 6.0
#: A spike is also this many times the window's mean (healthy detection
#: steps measured up to 13.8x).
DEFAULT_MIN_RATIO = 20.0

_ARGS = ('window', 'sigmas', 'min_ratio')


class GradSpikeDetector:
    """Rolling statistics of the gradient norms of applied steps, and the
    verdict on a new one.

    A norm is a spike when, with a full window of ``window`` applied steps
    before it, it is more than ``sigmas`` sample standard deviations above
    the window's mean **and** more than ``min_ratio`` times that mean.
    Before the window is full nothing is judged (warm-up). Only applied
    steps enter the window (:meth:`accept`); a skipped one never does.

    Args:
        window (int): applied steps in the rolling window. Defaults to 128
            (OLMo-core).
        sigmas (float): standard deviations above the window's mean.
            Defaults to 6 (OLMo-core).
        min_ratio (float): the spike must also exceed this multiple of the
            window's mean (1 turns this floor off). Defaults to 20.

    Raises:
        ValueError: a setting out of range.
    """

    def __init__(self, window: int = DEFAULT_WINDOW,
                 sigmas: float = DEFAULT_SIGMAS,
                 min_ratio: float = DEFAULT_MIN_RATIO) -> None:
        if int(window) < 2:
            raise MMSafeValueError(
                f'spike_skip window must be >= 2 steps, got {window}')
        if not float(sigmas) > 0:
            raise MMSafeValueError(
                f'spike_skip sigmas must be > 0, got {sigmas}')
        if not float(min_ratio) >= 1:
            raise MMSafeValueError(
                f'spike_skip min_ratio must be >= 1, got {min_ratio}')
        self.window = int(window)
        self.sigmas = float(sigmas)
        self.min_ratio = float(min_ratio)
        self.norms: deque = deque(maxlen=self.window)

    @classmethod
    def from_config(cls, cfg: Any) -> Optional['GradSpikeDetector']:
        """The detector that ``cfg`` describes: None or False for none,
        True for the defaults, a dict of ``window``, ``sigmas``,
        ``min_ratio`` (missing keys take the defaults).

        Raises:
            ValueError: an unknown key or a value out of range.
            TypeError: ``cfg`` is of another type.
        """
        if cfg is None or cfg is False:
            return None
        if cfg is True:
            return cls()
        if isinstance(cfg, dict):
            unknown = sorted(set(cfg) - set(_ARGS))
            if unknown:
                raise MMSafeValueError(
                    f'unknown spike_skip keys {unknown}; valid: '
                    f'{list(_ARGS)}')
            return cls(**cfg)
        from mmsafe.errors import MMSafeTypeError
        raise MMSafeTypeError('spike_skip must be None, a bool or a dict of '
                              f'{list(_ARGS)}, got {cfg!r}')

    @property
    def ready(self) -> bool:
        """Whether the window is full (judging has begun)."""
        return len(self.norms) >= self.window

    def statistics(self) -> Dict[str, float]:
        """Mean, sample standard deviation and threshold of the window.

        Returns:
            dict: ``mean``, ``std``, ``threshold`` (the norm above which a
            step is a spike) and ``steps`` (values in the window).
        """
        n = len(self.norms)
        mean = math.fsum(self.norms) / n if n else float('nan')
        var = (math.fsum((v - mean)**2 for v in self.norms) / (n - 1)
               if n > 1 else 0.0)
        std = math.sqrt(var)
        threshold = max(mean + self.sigmas * std, self.min_ratio * mean)
        return dict(mean=mean, std=std, threshold=threshold, steps=n)

    def judge(self, norm: float) -> Optional[Dict[str, float]]:
        """The verdict on a finite gradient norm (not added to the window).

        Args:
            norm (float): the step's global gradient norm.

        Returns:
            dict | None: None when the step may be applied; for a spike,
            the window's :meth:`statistics` plus ``norm``, ``sigmas_above``
            (how many standard deviations above the mean the norm is) and
            ``ratio`` (norm / mean).
        """
        if not self.ready:
            return None
        stats = self.statistics()
        if norm <= stats['threshold']:
            return None
        std, mean = stats['std'], stats['mean']
        stats.update(
            norm=float(norm),
            sigmas_above=(norm - mean) / std if std > 0 else float('inf'),
            ratio=norm / mean if mean > 0 else float('inf'),
            sigmas=self.sigmas, min_ratio=self.min_ratio)
        return stats

    def accept(self, norm: float) -> None:
        """Add the gradient norm of an applied step to the window."""
        self.norms.append(float(norm))

    def describe(self) -> str:
        """The rule in words, for log lines."""
        return (f'mean + {self.sigmas:g} std and {self.min_ratio:g}x the '
                f'mean of the last {self.window} applied steps')

    def state_dict(self) -> Dict[str, Any]:
        """The settings and the window (plain numbers, for checkpoints)."""
        return dict(window=self.window, sigmas=self.sigmas,
                    min_ratio=self.min_ratio, norms=list(self.norms))

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the window of :meth:`state_dict` (the settings are this
        detector's own: a resumed run may judge with new ones)."""
        self.norms.clear()
        self.norms.extend(float(v) for v in state.get('norms', []))

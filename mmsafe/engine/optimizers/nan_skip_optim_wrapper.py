"""An optim wrapper that turns NaN/Inf losses and gradients into a logged,
bounded skip that every DDP rank takes together, with no communication of
its own on a healthy step.

How ranks agree without a collective: a rank whose loss is not finite runs
its backward pass with a NaN seed gradient, so every gradient it produces is
NaN. DDP's gradient all-reduce then carries the NaN to every rank, exactly
as it carries a NaN or Inf that arose inside the backward pass. After the
all-reduce the gradients are identical on every rank, so the global norm
that the wrapper measures, and the skip-or-step decision taken from it, are
identical too. A healthy step seeds its backward with exactly 1.0, which is
what ``loss.backward()`` does: nothing changes.

Gradient spikes (``spike_skip``, :mod:`.grad_spike`): the same norm, a
Python number once it has been read, is judged against the rolling
statistics of the norms of recently applied steps, which every rank holds
alike; a step far above them is skipped like a non-finite one, on every
rank, with no communication and no device read added.

Learning-rate schedule on a skipped step: MMEngine's ``ParamSchedulerHook``
steps the parameter schedulers after every training iteration (or epoch),
whether or not the optimizer stepped, so by default a skipped step still
consumes one iteration of the schedule (warmup included): the schedule
follows the iteration count, as in any MMEngine run. To hold the schedule
on skipped steps instead (DeepSpeed's and Megatron-LM's behaviour), use
:class:`~mmsafe.engine.hooks.SkipAwareParamSchedulerHook`. Momentum
buffers, Adam moments (and Adam's step counter) and weight decay are
untouched by a skipped step because ``optimizer.step()`` is not called.
"""
import logging
import math
import weakref
from collections import deque
from contextlib import contextmanager
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn
from mmengine.optim import OptimWrapper
from torch.optim import Optimizer

from mmsafe.registry import OPTIM_WRAPPERS
from mmsafe.dist import current_iter
from mmsafe.engine.utils import unwrap_model
from mmsafe.errors import MMSafeValueError
from mmsafe.guard_outputs import (CounterKey, Event, GuardOutputs, Scalar,
                                  Section)
from mmsafe.events import batch_file_names, update_counters, update_scalar
from .grad_norm import clip_per_module, parse_module_rules, total_norm
from .grad_spike import GradSpikeDetector
from .skip_report import (GRAD_SPIKE, NONFINITE_GRAD, ZERO_GRAD, plain,
                          record_skip, too_many_skips)


@OPTIM_WRAPPERS.register_module()
class NaNSkipOptimWrapper(OptimWrapper):
    """Drop-in :class:`mmengine.optim.OptimWrapper` that skips non-finite
    optimizer steps consistently on every rank.

    Backward always runs on every rank. At each accumulation boundary the
    wrapper measures the global gradient norm, after DDP's all-reduce made
    the gradients identical on every rank, and skips the step when it is not
    finite (a non-finite loss on any rank makes it NaN, see the module
    docstring) or, with ``skip_zero_grad``, exactly 0 (no rank produced any
    signal: e.g. every rank's batch was empty and the model's losses vanish
    on empty input; stepping would only apply weight decay and momentum).
    On a skip every rank zeroes its gradients and skips ``optimizer.step()``;
    with gradient accumulation the whole window is dropped. Reading the
    norm is the wrapper's one host synchronisation per step; it never adds a
    collective to a healthy step.

    Skips are counted (``train/skipped_steps``, ``train/nan_skips``,
    ``train/consecutive_skips``, ``train/amp_overflows`` in the logs; the
    counters are part of :meth:`state_dict`, so a resumed run continues
    them), logged with iteration, the rank(s) whose loss was not finite,
    loss, gradient norm and the batch's image paths (rank 0's log shows
    every rank: one ``all_gather_object``, on skipped steps only, taken by
    every rank because every rank skips), written to
    ``{work_dir}/mmsafe_events.jsonl`` by every rank once a work dir is
    bound (:meth:`bind_work_dir`; :class:`~mmsafe.engine.runner.SafeRunner`
    binds its own), and bounded by ``max_consecutive_skips``.

    The batch's image paths are read with a forward pre-hook that the
    wrapper puts on the model's ``data_preprocessor`` the first time
    ``optim_context`` sees the model (MMEngine's ``train_step`` always calls
    it), so nothing but ``optim_wrapper.type`` has to change in a config.

    A non-finite gradient norm is never written into ``train/grad_norm``;
    the pre-clipping global norm of every applied step is.

    **Spike skip** (``spike_skip``, off unless set here or by the run's
    ``mmsafe_spike_skip`` config key, see :meth:`use_run_spike_skip`): a
    finite step whose global gradient norm, pre-clipping, is more than
    ``sigmas`` standard deviations above the mean of the last ``window``
    applied steps, and more than ``min_ratio`` times that mean, is skipped
    (reason ``grad_spike``, counter ``train/spike_skips``), exactly like a
    non-finite one. Nothing is judged before ``window`` steps were applied;
    skipped steps never enter the window. The window is part of
    :meth:`state_dict`. Defaults and their sources:
    :mod:`~mmsafe.engine.optimizers.grad_spike`.

    Every skip (non-finite, zero, spike) also records, per image of the
    skipped batches, its file names, size, value range as loaded and a
    summary of its annotations (boxes, largest and smallest box, class
    ids): in the log line and in the ``step_skip`` event.

    Args:
        optimizer (Optimizer): the optimizer.
        accumulative_counts (int): iterations per optimizer step.
            Defaults to 1.
        clip_grad (dict, optional): global clipping, as in ``OptimWrapper``
            (``dict(max_norm=35, norm_type=2)`` or
            ``dict(type='value', clip_value=...)``), applied after the
            per-module clipping. Defaults to None.
        clip_grad_per_module (list[dict], optional): per-module gradient
            clipping, e.g. ``[dict(pattern='roi_head', max_norm=0.5),
            dict(pattern=r'backbone\\.layer4', max_norm=0.3, norm_type=2)]``.
            ``pattern`` is a regular expression searched in the parameter
            names of the unwrapped model; a parameter follows the first rule
            that matches it. Each group's pre-clipping norm is logged as
            ``train/grad_norm_<pattern>``. A pattern that matches nothing
            is an error. Defaults to None.
        max_consecutive_skips (int): stop training with an error naming the
            last bad iterations and their image paths after this many skipped
            steps in a row (every reason counts). 0 disables the bound.
            Defaults to 20.
        log_all_ranks (bool): on a skip, gather every rank's loss and image
            paths (one ``all_gather_object``, only on skipped steps) so that
            every rank's log names the rank whose loss was not finite.
            Defaults to True.
        skip_zero_grad (bool): skip a step whose global gradient norm is
            exactly 0 (reason ``zero_grad``). Defaults to True.
        spike_skip (bool | dict, optional): skip gradient-norm spikes:
            True for the defaults, or a dict of ``window`` (steps, default
            128), ``sigmas`` (default 6) and ``min_ratio`` (default 20);
            False turns it off whatever the run's config says. None (the
            default) leaves it to the run's ``mmsafe_spike_skip`` config
            key (off without one).
    """

    guard_outputs = GuardOutputs(
        Section.SKIPPED_STEPS,
        events=(Event.STEP_SKIP, ),
        counters=(CounterKey.STEP_GUARD, ),
        scalars=(Scalar.GRAD_NORM, 'train/grad_norm_{}',
                 Scalar.SKIPPED_STEPS, Scalar.NAN_SKIPS,
                 Scalar.CONSECUTIVE_SKIPS, Scalar.AMP_OVERFLOWS,
                 Scalar.SPIKE_SKIPS))

    def __init__(self,
                 optimizer: Optimizer,
                 accumulative_counts: int = 1,
                 clip_grad: Optional[dict] = None,
                 clip_grad_per_module: Optional[Sequence[dict]] = None,
                 max_consecutive_skips: int = 20,
                 log_all_ranks: bool = True,
                 skip_zero_grad: bool = True,
                 spike_skip: Optional[Union[bool, dict]] = None) -> None:
        super().__init__(optimizer=optimizer,
                         accumulative_counts=accumulative_counts,
                         clip_grad=clip_grad)
        if max_consecutive_skips < 0:
            raise MMSafeValueError('max_consecutive_skips must be >= 0, got '
                                   f'{max_consecutive_skips}')
        self.max_consecutive_skips = max_consecutive_skips
        self.log_all_ranks = log_all_ranks
        self.clip_grad_per_module = parse_module_rules(clip_grad_per_module)
        self.skip_zero_grad = skip_zero_grad
        self.spike_detector: Optional[GradSpikeDetector] = \
            GradSpikeDetector.from_config(spike_skip)
        # who decided: this wrapper's own argument (a run's setting then
        # does not apply), the run's config, or nobody yet
        self._spike_skip_source: Optional[str] = (
            None if spike_skip is None else 'argument')
        self.counters: Dict = dict(
            skipped=0, consecutive=0, nan_skips=0, amp_overflow=0,
            spike_skips=0, steps=0, by_reason={})
        # (iteration, {rank: image paths}) of the latest skipped windows.
        self.recent_bad: deque = deque(maxlen=max(5, max_consecutive_skips))
        self._window: List[dict] = []
        self._skip_request: Optional[str] = None
        self._batch_files: List[str] = []
        self._batch_data: Any = None
        self._model_ref = None
        self._param_names: Dict[int, str] = {}
        self.work_dir: Optional[str] = None

    def bind_work_dir(self, work_dir: Optional[str]) -> None:
        """Write skip events to ``{work_dir}/mmsafe_events.jsonl`` (None:
        log only)."""
        self.work_dir = work_dir

    def use_run_spike_skip(self, spike_skip: Optional[Union[bool, dict]]
                           ) -> bool:
        """Take the run's spike-skip setting (the config's
        ``mmsafe_spike_skip``, which ``configs/_base_/safety_runtime.py``
        sets) unless this wrapper's own ``spike_skip`` argument decided.

        Args:
            spike_skip (bool | dict, optional): as the ``spike_skip``
                argument.

        Returns:
            bool: whether the run's setting was taken now (False when the
            wrapper's own argument decides, when there is none, or when it
            was taken before).
        """
        if self._spike_skip_source is not None or spike_skip is None:
            return False
        self.spike_detector = GradSpikeDetector.from_config(spike_skip)
        self._spike_skip_source = 'run'
        return True

    @property
    def spike_skip_source(self) -> Optional[str]:
        """Who set the spike skip: ``'argument'`` (the wrapper's own
        ``spike_skip``), ``'run'`` (the config's ``mmsafe_spike_skip``) or
        None (nobody: off)."""
        return self._spike_skip_source

    # ------------------------------------------------------------------ #
    # what other components read
    @property
    def accumulation_window(self) -> int:
        """Iterations per optimizer step (``accumulative_counts``): a
        skipped step skips the updates of this many iterations."""
        return int(self._accumulative_counts or 1)

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped so far in this run."""
        return int(self.counters['skipped'])

    @property
    def unstable_skips(self) -> int:
        """Steps skipped so far because the gradient was not finite or
        spiked (fp16 loss-scale overflows, zero gradients and requested
        skips not counted): what tells a diverging run."""
        return int(self.counters['nan_skips'] + self.counters['spike_skips'])

    # ------------------------------------------------------------------ #
    # model watching: parameter names and the batch's image paths
    @contextmanager
    def optim_context(self, model: nn.Module):
        """See :meth:`OptimWrapper.optim_context`; also learns the model's
        parameter names once, and the image paths of the batch that the
        data preprocessor gets inside this context (MMEngine's
        ``train_step`` preprocesses the batch there). The preprocessor's
        hook lives for this context only."""
        handle = self._watch_model(model)
        try:
            with super().optim_context(model):
                yield
        finally:
            if handle is not None:
                handle.remove()

    def _watch_model(self, model: nn.Module):
        module = unwrap_model(model)
        if self._model_ref is None or self._model_ref() is not module:
            self._model_ref = weakref.ref(module)
            self._param_names = {
                id(p): name
                for name, p in module.named_parameters()
            }
        preprocessor = getattr(module, 'data_preprocessor', None)
        if not isinstance(preprocessor, nn.Module):
            return None

        def record_batch_files(_module, args, kwargs):
            data = args[0] if args else kwargs.get('data')
            if isinstance(data, dict):
                self._batch_files = batch_file_names(data)
                # a reference only: summarised when the step is skipped
                self._batch_data = data

        return preprocessor.register_forward_pre_hook(
            record_batch_files, with_kwargs=True)

    # ------------------------------------------------------------------ #
    # the training step
    def request_skip(self, reason: str) -> None:
        """Ask to skip the step that the next backward belongs to.

        The step is skipped only when every iteration of its accumulation
        window asked. The caller must ask on every rank alike (e.g. after
        its own all-reduce), because the wrapper does not communicate.

        Args:
            reason (str): the skip reason that is counted and logged.
        """
        self._skip_request = reason

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """Run the backward pass (always, so that DDP's gradient all-reduce
        happens on every rank), seeded with NaN when the loss is not finite.

        No value is read from the device here: the loss and its finiteness
        stay tensors until the step.
        """
        detached = loss.detach()
        finite = torch.isfinite(detached).all()
        if kwargs.get('gradient') is None:
            # 1.0 on a healthy step, exactly what loss.backward() uses; NaN
            # otherwise, so that every gradient of this rank, and through
            # DDP's all-reduce every rank's, becomes NaN.
            ones = torch.ones_like(loss)
            kwargs['gradient'] = torch.where(finite, ones, ones * math.nan)
        self._window.append(
            dict(iter=current_iter(), loss=detached,
                 files=list(self._batch_files), batch=self._batch_data,
                 request=self._skip_request))
        self._skip_request = None
        self._backward(loss, **kwargs)
        self._inner_count += 1

    def _backward(self, loss: torch.Tensor, **kwargs) -> None:
        loss.backward(**kwargs)

    def step(self, **kwargs) -> None:
        """Decide from the all-reduced gradients, then clip and step, or
        skip. Every rank reaches the same decision without communicating.

        Args:
            kwargs: arguments for ``optimizer.step``.
        """
        self._unscale()
        params = self._params_with_grad()
        norm_type = 2.0
        if self.clip_grad_kwargs and self.grad_name == 'grad_norm':
            norm_type = float(self.clip_grad_kwargs.get('norm_type', 2.0))
        norm = total_norm([p.grad for p in params], norm_type)
        window = self._window
        self._window = []
        # The one host synchronisation of the step.
        grad_norm = float(norm)

        reasons = []
        if not math.isfinite(grad_norm):
            reasons.append(self._nonfinite_reason())
        elif grad_norm == 0.0 and self.skip_zero_grad and params:
            reasons.append(ZERO_GRAD)
        requests = [w['request'] for w in window]
        if window and all(requests):
            reasons.extend(r for r in dict.fromkeys(requests)
                           if r not in reasons)
        spike = None
        if not reasons and self.spike_detector is not None and params:
            spike = self.spike_detector.judge(grad_norm)
            if spike is not None:
                reasons.append(GRAD_SPIKE)
        if reasons:
            self._skip(reasons, window, grad_norm, spike)
        else:
            self._apply(params, grad_norm, total_norm=norm, **kwargs)
            if self.spike_detector is not None and params:
                self.spike_detector.accept(grad_norm)
        self._publish()

    def _nonfinite_reason(self) -> str:
        return NONFINITE_GRAD

    def _params_with_grad(self) -> List[torch.Tensor]:
        return [
            p for group in self.optimizer.param_groups
            for p in group['params'] if p.requires_grad and p.grad is not None
        ]

    def _apply(self, params: List[torch.Tensor], grad_norm: float,
               total_norm: Optional[torch.Tensor] = None, **kwargs) -> None:
        update_scalar(self.message_hub, Scalar.GRAD_NORM, grad_norm)
        if self.clip_grad_per_module:
            clip_per_module(params, self.clip_grad_per_module,
                            self._param_names, self.message_hub)
        if self.clip_grad_kwargs and params:
            clip_with_norm = getattr(torch.nn.utils, 'clip_grads_with_norm_',
                                     None)
            if (clip_with_norm is not None and total_norm is not None
                    and self.grad_name == 'grad_norm'
                    and not self.clip_grad_per_module
                    and set(self.clip_grad_kwargs) <= {'max_norm',
                                                       'norm_type'}):
                # The total norm was measured for the skip decision with the
                # same norm_type; clipping reuses it instead of a second pass
                # over every gradient.
                clip_with_norm(params, self.clip_grad_kwargs['max_norm'],
                               total_norm)
            else:
                self.clip_func(params, **self.clip_grad_kwargs)
        self._optimizer_step(**kwargs)
        self.counters['steps'] += 1
        self.counters['consecutive'] = 0

    def _skip(self, reasons: List[str], window: List[dict],
              grad_norm: float, spike: Optional[dict] = None) -> None:
        record_skip(self.counters, self.recent_bad, reasons, window,
                    grad_norm, self.log_all_ranks, self.work_dir, spike)
        self._skip_step(reasons)
        self.optimizer.zero_grad()
        limit = self.max_consecutive_skips
        if limit and self.counters['consecutive'] >= limit:
            raise too_many_skips(self.counters, list(self.recent_bad), limit)

    def _publish(self) -> None:
        c = self.counters
        hub = self.message_hub
        update_scalar(hub, Scalar.SKIPPED_STEPS, c['skipped'])
        update_scalar(hub, Scalar.NAN_SKIPS, c['nan_skips'])
        update_scalar(hub, Scalar.CONSECUTIVE_SKIPS, c['consecutive'])
        if self._is_amp():
            update_scalar(hub, Scalar.AMP_OVERFLOWS, c['amp_overflow'])
        if self.spike_detector is not None:
            update_scalar(hub, Scalar.SPIKE_SKIPS, c['spike_skips'])
        update_counters(CounterKey.STEP_GUARD, **c)

    # ------------------------------------------------------------------ #
    # hooks for the AMP subclass
    def _is_amp(self) -> bool:
        return False

    def _unscale(self) -> None:
        """Bring the gradients to their true scale before the checks."""

    def _optimizer_step(self, **kwargs) -> None:
        self.optimizer.step(**kwargs)

    def _skip_step(self, reasons: List[str]) -> None:
        """Leave optimizer state (and the AMP scaler) legal on a skip."""

    # ------------------------------------------------------------------ #
    # checkpointing
    def state_dict(self) -> dict:
        """The optimizer's state dict plus ``mmsafe_step_guard`` counters."""
        state = super().state_dict()
        state['mmsafe_step_guard'] = dict(
            counters=plain(self.counters),
            recent_bad=plain(list(self.recent_bad)),
            spike=(None if self.spike_detector is None else
                   self.spike_detector.state_dict()))
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the optimizer and the skip counters."""
        state_dict = dict(state_dict)
        guard = state_dict.pop('mmsafe_step_guard', None)
        if guard is not None:
            self.counters.update(guard.get('counters', {}))
            self.recent_bad.clear()
            self.recent_bad.extend(guard.get('recent_bad', []))
            if guard.get('spike') and self.spike_detector is not None:
                self.spike_detector.load_state_dict(guard['spike'])
        super().load_state_dict(state_dict)

    def rewind(self, state_dict: dict) -> None:
        """Go back to an earlier :meth:`state_dict` for a rollback: the
        optimizer's state, the AMP loss scaler's and the spike window are
        restored; the skip counters keep counting the skips that happened
        (only the count of skips in a row restarts at 0).

        Args:
            state_dict (dict): a :meth:`state_dict` of this wrapper.
        """
        counters = plain(self.counters)
        recent_bad = list(self.recent_bad)
        self.load_state_dict(state_dict)
        self.counters.update(counters)
        self.counters['consecutive'] = 0
        self.recent_bad.clear()
        self.recent_bad.extend(recent_bad)
        self._window = []


def _nan_skip_wrappers(optim_wrapper) -> List[NaNSkipOptimWrapper]:
    """The NaN-skip wrappers in ``optim_wrapper`` (itself, or the wrappers
    of an ``OptimWrapperDict``)."""
    inner = getattr(optim_wrapper, 'optim_wrappers', None)
    return [w for w in (inner.values() if isinstance(inner, dict)
                        else [optim_wrapper])
            if isinstance(w, NaNSkipOptimWrapper)]


def bind_work_dirs(optim_wrapper, work_dir: Optional[str]) -> None:
    """:meth:`NaNSkipOptimWrapper.bind_work_dir` for every NaN-skip wrapper
    in ``optim_wrapper`` (itself, or the wrappers of an
    ``OptimWrapperDict``); other wrappers are left as they are."""
    for wrapper in _nan_skip_wrappers(optim_wrapper):
        wrapper.bind_work_dir(work_dir)


def use_run_spike_skip(optim_wrapper,
                       spike_skip: Optional[Union[bool, dict]]) -> None:
    """:meth:`NaNSkipOptimWrapper.use_run_spike_skip` for every NaN-skip
    wrapper in ``optim_wrapper``, with the run config's
    ``mmsafe_spike_skip``; says once which rule each wrapper judges by."""
    from mmsafe.events import log_once
    for wrapper in _nan_skip_wrappers(optim_wrapper):
        wrapper.use_run_spike_skip(spike_skip)
        detector = wrapper.spike_detector
        name = type(wrapper).__name__
        if detector is not None:
            where = ('optim_wrapper.spike_skip'
                     if wrapper.spike_skip_source == 'argument'
                     else 'mmsafe_spike_skip')
            log_once(f'spike_skip:{id(wrapper)}',
                     f'{name}: a step whose gradient norm is above '
                     f'{detector.describe()} is skipped ({where}; judged '
                     f'once {detector.window} steps were applied).',
                     logging.INFO)
        elif spike_skip:
            log_once(f'spike_skip:{id(wrapper)}',
                     f'{name}: optim_wrapper.spike_skip=False overrides '
                     'mmsafe_spike_skip: gradient-norm spikes are not '
                     'skipped.', logging.INFO)

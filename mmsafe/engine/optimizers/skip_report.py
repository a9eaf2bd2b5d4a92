"""What the NaN-skip wrappers say about a skipped step: the cause, the log
line and the error after too many skips in a row."""
import logging
import math
from collections import deque
from typing import Dict, List, Optional

from mmsafe.dist import all_gather_object, current_iter, get_rank
from mmsafe.errors import MMSafeRuntimeError
from mmsafe.guard_outputs import Event
from mmsafe.events import log, write_event
from .batch_summary import batch_summary, describe

#: Skip reasons.
NONFINITE_LOSS = 'nonfinite_loss'
NONFINITE_GRAD = 'nonfinite_grad'
AMP_OVERFLOW = 'amp_overflow'
ZERO_GRAD = 'zero_grad'
GRAD_SPIKE = 'grad_spike'

#: Images summarised per rank in a skip's log line (the event has all).
LOGGED_IMAGES = 8


def current_epoch() -> Optional[int]:
    """The runner's current epoch (0-based) from the message hub, if any."""
    from mmengine.logging import MessageHub
    epoch = MessageHub.get_current_instance().get_info('epoch')
    return None if epoch is None else int(epoch)


def shown(it: Optional[int]):
    """1-based iteration, as in MMEngine's ``Iter(train) [k/N]`` lines (the
    JSONL events keep the 0-based ``runner.iter``)."""
    return '?' if it is None else it + 1


def fmt(value: Optional[float]) -> str:
    return 'n/a' if value is None else f'{value:.6g}'


def counter_kind(reason: str) -> Optional[str]:
    """The counter a skip with first reason ``reason`` adds to."""
    if reason in (NONFINITE_LOSS, NONFINITE_GRAD):
        return 'nan_skips'
    if reason == GRAD_SPIKE:
        return 'spike_skips'
    return 'amp_overflow' if reason == AMP_OVERFLOW else None


def culprit(reasons: List[str], bad_ranks: List[int], num_ranks: int,
            spike: Optional[dict] = None) -> str:
    """Why the step was skipped, in words."""
    if bad_ranks:
        return (f'the loss was not finite on rank(s) {bad_ranks}, and its '
                'NaN gradients reached every rank through the gradient '
                'all-reduce')
    if reasons[0] in (NONFINITE_GRAD, AMP_OVERFLOW):
        return ('the losses were finite' +
                (' on every rank' if num_ranks > 1 else '') +
                ', but the gradient is not (a NaN/Inf arose in the backward '
                'pass, or a loss term\'s NaN was replaced before the loss '
                'dict, e.g. by nan_to_num, which leaves the term unknown' +
                (', or the fp16 loss scale overflowed'
                 if reasons[0] == AMP_OVERFLOW else '') + ')')
    if reasons[0] == GRAD_SPIKE and spike:
        return (f"the gradient norm {fmt(spike['norm'])} is "
                f"{fmt(spike['sigmas_above'])} standard deviations above the "
                f"mean {fmt(spike['mean'])} (std {fmt(spike['std'])}) of the "
                f"last {spike['steps']} applied steps, {fmt(spike['ratio'])}x "
                f"that mean (threshold {fmt(spike['threshold'])}: mean + "
                f"{spike['sigmas']:g} std, at least {spike['min_ratio']:g}x "
                'the mean); the batch is far from what the network was '
                'trained on so far (check its images and boxes) or the '
                'learning rate jumped')
    if reasons[0] == ZERO_GRAD:
        return ('the gradient is exactly 0 on every parameter: no rank '
                'produced any training signal (e.g. every batch was empty '
                'and the losses vanish on empty input)')
    return f'requested ({reasons[0]})'


def skip_message(it: Optional[int], iters: List[Optional[int]],
                 reasons: List[str], cause: str, grad_norm: float,
                 everyone: List[dict], counters: Dict) -> str:
    """The log lines of a skipped step: the cause, every rank's losses and
    files, then each rank's images with their size, value range and
    annotations."""
    details = '; '.join(
        f"rank {r['rank']}: loss={[fmt(v) for v in r['losses']]} "
        f"files={r['files']}" for r in everyone)
    lines = [f'skipped the optimizer step of Iter(train) {shown(it)} '
             f'(window {[shown(i) for i in iters]}) on all ranks, reasons '
             f'{reasons}: {cause}. grad_norm={fmt(grad_norm)}; {details}; '
             f"skipped {counters['skipped']} steps so far, "
             f"{counters['consecutive']} in a row"]
    for r in everyone:
        images = r.get('images') or []
        lines += [f"  rank {r['rank']} image: {describe(e)}"
                  for e in images[:LOGGED_IMAGES]]
        if len(images) > LOGGED_IMAGES:
            lines.append(f"  rank {r['rank']}: {len(images) - LOGGED_IMAGES}"
                         ' more images in the step_skip event')
    return '\n'.join(lines)


def too_many_skips(counters: Dict, recent_bad: List[dict],
                   limit: int) -> RuntimeError:
    """The error that ends a run after ``limit`` skips in a row."""
    bad = '; '.join(
        f"Iter(train) {shown(b['iter'])} ({', '.join(b['reasons'])}): " +
        ', '.join(f'rank {r} {files}'
                  for r, files in sorted(b['files'].items()))
        for b in recent_bad[-limit:])
    spikes = any(GRAD_SPIKE in b['reasons'] for b in recent_bad[-limit:])
    hint = (' Skips for grad_spike in a row after a lasting change of the '
            'gradient\'s level (a module unfrozen, a schedule step) mean the '
            'spike rule is too tight for this run: raise spike_skip\'s '
            "sigmas or min_ratio. A run that diverged can be rolled back by "
            'DivergenceRollbackHook.' if spikes else '')
    return MMSafeRuntimeError(
        f"[mmsafe] {counters['consecutive']} optimizer steps in a row were "
        f'skipped (max_consecutive_skips={limit}); training is not making '
        f'progress. Last bad iterations: {bad}. Check these images '
        '(tools/check_dataset.py CONFIG --files WORK_DIR/'
        'mmsafe_events.jsonl checks them all), lower the learning rate or '
        'enable '
        'gradient clipping; raise optim_wrapper.max_consecutive_skips only '
        f'if such runs of skips are expected.{hint}')


def plain(value):
    """Only builtin types, so checkpoints load with ``weights_only=True``."""
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int)) else str(k): plain(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def record_skip(counters: Dict, recent_bad: deque, reasons: List[str],
                window: List[dict], grad_norm: float, gather: bool,
                work_dir: Optional[str],
                spike: Optional[dict] = None) -> None:
    """Count, log and record (event, ``recent_bad``) a skipped step.

    Every rank skips the step together, so with ``gather`` every rank
    joins one ``all_gather_object`` of the losses and files of the step's
    window, and every rank's log names the rank(s) whose loss was not
    finite. The window's losses are read from the device only here.

    Args:
        counters (dict): the wrapper's counters, updated in place.
        recent_bad (deque): the latest skipped windows, appended to.
        reasons (list[str]): the skip reasons, first the main one.
        window (list[dict]): ``iter``, ``loss``, ``files`` and ``batch``
            (the collated batch, or None) per backward.
        grad_norm (float): the step's global gradient norm.
        gather (bool): gather every rank's losses and files.
        work_dir (str, optional): where the ``step_skip`` event goes.
        spike (dict, optional): the spike detector's verdict
            (:meth:`~.grad_spike.GradSpikeDetector.judge`) for a
            ``grad_spike`` skip.
    """
    it = window[-1]['iter'] if window else current_iter()
    iters = [w['iter'] for w in window]
    # Only now, on the skip path, are the losses read from the device.
    losses = [float(w['loss'].float().sum()) for w in window]
    mine = dict(rank=get_rank(), iters=iters, losses=losses,
                loss_finite=[math.isfinite(v) for v in losses],
                files=[f for w in window for f in w['files']],
                images=[e for w in window
                        for e in batch_summary(w.get('batch'))])
    # Every rank skips this step, so every rank joins the gather.
    everyone = all_gather_object(mine) if gather else [mine]
    bad_ranks = [r['rank'] for r in everyone
                 if not all(r['loss_finite'])]
    if bad_ranks and reasons[0] in (NONFINITE_GRAD, AMP_OVERFLOW):
        reasons = [NONFINITE_LOSS] + reasons[1:]
    kind = counter_kind(reasons[0])
    counters['skipped'] += 1
    counters['consecutive'] += 1
    if kind is not None:
        counters[kind] += 1
    by_reason = counters['by_reason']
    for reason in reasons:
        by_reason[reason] = by_reason.get(reason, 0) + 1

    write_event(work_dir, Event.STEP_SKIP, iter=it, iters=iters,
                epoch=current_epoch(), reasons=reasons,
                cause=kind or reasons[0], bad_ranks=bad_ranks, loss=losses,
                grad_norm=grad_norm, spike=spike, files=mine['files'],
                images=mine['images'], skipped=counters['skipped'],
                consecutive=counters['consecutive'])
    log(skip_message(it, iters, reasons,
                     culprit(reasons, bad_ranks, len(everyone), spike),
                     grad_norm, everyone, counters),
        # fp16 overflows are routine while the loss scale settles.
        logging.INFO if kind == 'amp_overflow' else logging.WARNING)
    recent_bad.append(
        dict(iter=it, reasons=reasons,
             files={r['rank']: r['files'] for r in everyone}))

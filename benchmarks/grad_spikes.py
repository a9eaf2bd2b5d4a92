"""Which faulty images move a Faster R-CNN's gradient, and by how much?

Trains the CPU demo detector (``configs/llvip/demo_cpu.py``: the
dual-stream Faster R-CNN with MACL, on the synthetic LLVIP-like data) for
``--warm`` iterations, then measures the global gradient norm (the number
``NaNSkipOptimWrapper`` judges, before clipping) of ``--batches`` training
batches as they are and with one image of the batch replaced by a fault:

* ``ir_raw16``: the infrared image as a radiometric 16-bit frame read
  unchanged (raw counts 51300-52150, as FLIR ADAS's TIFFs hold them) among
  8-bit ones;
* ``vis_raw16``: a 16-bit visible frame read unchanged (0-65535);
* ``unscaled_float``: both images of the pair saved as floats in 0-1
  (a float image written without its x255);
* ``sensor_rows``: four saturated rows (255) across the infrared image (a
  broken sensor row, values still in range);
* ``huge_box``: the first box of the image stretched 10x past the image;
* ``tiny_box``: the first box shrunk to 0.1 x 0.1 pixels.

Per fault it prints the median and the minimum over the batches of
``grad_norm(faulty) / grad_norm(clean)`` and of the loss ratio, both at the
start and after the warm-up; which faults a spike rule of ``--sigmas``
standard deviations and ``--min-ratio`` times the mean of the warm-up's
own norms (the last 128) would catch; and, with ``--warm`` above 128, what
that rule says about the warm-up's own healthy steps. ``--frozen-bn``
freezes the backbones' BatchNorm statistics as the LLVIP recipe does.
Nothing here steps the optimizer on a faulty batch.

    python benchmarks/grad_spikes.py --frozen-bn     # warm 60, 8 batches
    python benchmarks/grad_spikes.py --warm 600 --batches 2  # healthy steps
"""
import argparse
import copy
import math
import os.path as osp
import statistics
import sys
import time
from typing import Callable, Dict, List

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks._common import DEMO_CONFIG, machine, uptime  # noqa: E402

#: Radiometric counts of a 16-bit thermal frame (the range of one FLIR ADAS
#: frame): an 8-bit image x is read as LOW + x * (HIGH - LOW) / 255.
RAW16_LOW, RAW16_HIGH = 51300.0, 52150.0


def _first_with_box(samples) -> int:
    for i, sample in enumerate(samples):
        if len(sample.gt_instances):
            return i
    return 0


def ir_raw16(batch: dict) -> dict:
    img = batch['inputs']['infrared'][0].float()
    batch['inputs']['infrared'][0] = RAW16_LOW + img * (
        (RAW16_HIGH - RAW16_LOW) / 255.0)
    return batch


def vis_raw16(batch: dict) -> dict:
    batch['inputs']['visible'][0] = batch['inputs']['visible'][0].float() \
        * 257.0
    return batch


def unscaled_float(batch: dict) -> dict:
    for name in ('visible', 'infrared'):
        batch['inputs'][name][0] = batch['inputs'][name][0].float() / 255.0
    return batch


def sensor_rows(batch: dict) -> dict:
    img = batch['inputs']['infrared'][0].clone()
    mid = img.shape[-2] // 2
    img[..., mid:mid + 4, :] = 255
    batch['inputs']['infrared'][0] = img
    return batch


def _set_first_box(batch: dict, change: Callable) -> dict:
    samples = batch['data_samples']
    i = _first_with_box(samples)
    gt = samples[i].gt_instances
    boxes = gt.bboxes
    tensor = getattr(boxes, 'tensor', boxes).clone()
    if len(tensor):
        tensor[0] = change(tensor[0])
        if hasattr(boxes, 'tensor'):
            gt.bboxes = type(boxes)(tensor)
        else:
            gt.bboxes = tensor
    return batch


def huge_box(batch: dict) -> dict:
    def stretch(box):
        x1, y1, x2, y2 = box.tolist()
        return box.new_tensor([x1, y1, x1 + 10 * (x2 - x1 + 160),
                               y1 + 10 * (y2 - y1 + 128)])
    return _set_first_box(batch, stretch)


def tiny_box(batch: dict) -> dict:
    def shrink(box):
        x1, y1 = box[0].item(), box[1].item()
        return box.new_tensor([x1, y1, x1 + 0.1, y1 + 0.1])
    return _set_first_box(batch, shrink)


FAULTS: Dict[str, Callable[[dict], dict]] = dict(
    ir_raw16=ir_raw16, vis_raw16=vis_raw16, unscaled_float=unscaled_float,
    sensor_rows=sensor_rows, huge_box=huge_box, tiny_box=tiny_box)


def build_runner(args):
    from mmengine.config import Config
    from mmengine.runner import Runner
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.work_dir = osp.join(REPO_ROOT, 'work_dirs', 'grad_spikes')
    cfg.custom_hooks = []
    cfg.visualizer = None  # nothing is drawn or logged to TensorBoard
    cfg.runner_type = 'Runner'
    cfg.optim_wrapper.type = 'OptimWrapper'
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=10**6,
                         val_interval=10**6)
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.01,
                                by_epoch=False, begin=0, end=50)]
    cfg.randomness = dict(seed=args.seed)
    if args.frozen_bn:
        # the LLVIP recipe's backbones (pretrained R50): BatchNorm with its
        # running statistics in training too, the stem and first stage
        # frozen
        for key in ('backbone', 'ir_backbone'):
            cfg.model[key].update(norm_eval=True, frozen_stages=1)
    return Runner.from_cfg(cfg)


def grad_norm_and_loss(model, batch: dict):
    import torch
    from mmsafe.engine.optimizers.grad_norm import total_norm
    model.zero_grad(set_to_none=True)
    data = model.data_preprocessor(batch, True)
    losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = float(total_norm(grads, 2.0))
    model.zero_grad(set_to_none=True)
    return norm, float(loss.detach()), torch.isfinite(loss).item()


def measure(runner, batches: List[dict], label: str, sigmas: float,
            min_ratio: float, window_norms: List[float]) -> None:
    model = runner.model
    buffers = copy.deepcopy({k: v for k, v in model.state_dict().items()})
    clean = []
    for batch in batches:
        clean.append(grad_norm_and_loss(model, copy.deepcopy(batch)))
        model.load_state_dict(buffers)  # BN statistics of the forward
    rule = None
    if len(window_norms) > 1:
        mean = statistics.fmean(window_norms)
        std = statistics.stdev(window_norms)
        rule = (mean, std, mean + sigmas * std)
    print(f'\n{label}: clean grad_norm median '
          f'{statistics.median(c[0] for c in clean):.4g} '
          f'(min {min(c[0] for c in clean):.4g}, max '
          f'{max(c[0] for c in clean):.4g}); clean loss median '
          f'{statistics.median(c[1] for c in clean):.4g}')
    if rule:
        print(f'  training window of {len(window_norms)} steps: mean '
              f'{rule[0]:.4g}, std {rule[1]:.4g}, mean + {sigmas:g} std = '
              f'{rule[2]:.4g}; largest clean/window ratio '
              f'{max(c[0] for c in clean) / rule[0]:.3g}')
    print(f"  {'fault':<15} {'grad x (median)':>16} {'grad x (min)':>13} "
          f"{'loss x (median)':>16} {'caught':>8}")
    for name, fault in FAULTS.items():
        ratios, loss_ratios, caught = [], [], 0
        for batch, (norm0, loss0, _) in zip(batches, clean):
            norm, loss, finite = grad_norm_and_loss(
                model, fault(copy.deepcopy(batch)))
            model.load_state_dict(buffers)
            ratios.append(norm / norm0 if math.isfinite(norm) else math.inf)
            loss_ratios.append(loss / loss0 if finite else math.inf)
            if rule and (not math.isfinite(norm) or
                         (norm > rule[2] and norm > min_ratio * rule[0])):
                caught += 1
        print(f'  {name:<15} {statistics.median(ratios):>16.4g} '
              f'{min(ratios):>13.4g} {statistics.median(loss_ratios):>16.4g} '
              f"{f'{caught}/{len(batches)}' if rule else '-':>8}")


def healthy_verdicts(norms: List[float], window: int, sigmas: float,
                     min_ratio: float) -> None:
    """What the spike rule says about a healthy run's own norms: every
    step judged against the ``window`` steps before it (all applied)."""
    from mmsafe.engine.optimizers.grad_spike import GradSpikeDetector
    worst_sigma, worst_ratio = 0.0, 0.0
    flagged = {1.0: 0, min_ratio: 0}
    top = []
    detector = GradSpikeDetector(window=window, sigmas=sigmas, min_ratio=1)
    for step, norm in enumerate(norms):
        if detector.ready:
            stats = detector.statistics()
            top.append(((norm - stats['mean']) / stats['std'],
                        norm / stats['mean'], step, norm))
            worst_sigma = max(worst_sigma,
                              (norm - stats['mean']) / stats['std'])
            worst_ratio = max(worst_ratio, norm / stats['mean'])
            for floor in flagged:
                if norm > max(stats['mean'] + sigmas * stats['std'],
                              floor * stats['mean']):
                    flagged[floor] += 1
        detector.accept(norm)
    judged = max(0, len(norms) - window)
    print(f'\nhealthy run, {len(norms)} steps ({judged} judged against the '
          f'{window} before): largest norm {worst_sigma:.3g} std above its '
          f"window's mean, largest norm / mean {worst_ratio:.3g}; flagged "
          f'at {sigmas:g} std: {flagged[1.0]} (no ratio floor), '
          f'{flagged[min_ratio]} (and >= {min_ratio:g}x the mean)')
    for sigma, ratio, step, norm in sorted(top, reverse=True)[:5]:
        print(f'  step {step}: norm {norm:.4g}, {sigma:.3g} std above, '
              f'{ratio:.3g}x the mean')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--warm', type=int, default=60,
                        help='training iterations before the second '
                        'measurement (default 60)')
    parser.add_argument('--batches', type=int, default=8,
                        help='batches measured per fault (default 8)')
    parser.add_argument('--sigmas', type=float, default=6.0,
                        help='spike rule: standard deviations (default 6)')
    parser.add_argument('--min-ratio', type=float, default=20.0,
                        help='spike rule: multiple of the window\'s mean '
                        '(default 20)')
    parser.add_argument('--frozen-bn', action='store_true',
                        help='the LLVIP recipe\'s backbone setting: '
                        'norm_eval=True, frozen_stages=1 (the demo trains '
                        'its BatchNorm statistics)')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    print(f'machine: {machine()}\nuptime before: {uptime()}')
    started = time.time()
    import mmsafe  # noqa: F401
    from mmsafe.engine.optimizers.grad_norm import total_norm
    runner = build_runner(args)
    loader = runner.build_dataloader(runner.cfg.train_dataloader,
                                     seed=args.seed)
    it = iter(loader)
    batches = [next(it) for _ in range(args.batches)]
    runner.model.train()
    measure(runner, batches, 'at initialisation', args.sigmas,
            args.min_ratio, [])
    wrapper = runner.build_optim_wrapper(runner.cfg.optim_wrapper)
    norms = []
    for _ in range(args.warm):
        batch = next(it)
        with wrapper.optim_context(runner.model):
            data = runner.model.data_preprocessor(batch, True)
            losses = runner.model(**data, mode='loss')
        loss, _ = runner.model.parse_losses(losses)
        wrapper.backward(loss)
        grads = [p.grad for p in runner.model.parameters()
                 if p.grad is not None]
        norms.append(float(total_norm(grads, 2.0)))
        wrapper.step()
        wrapper.zero_grad()
    if args.warm > 128:
        healthy_verdicts(norms, 128, args.sigmas, args.min_ratio)
    if args.warm:
        measure(runner, batches, f'after {args.warm} training iterations',
                args.sigmas, args.min_ratio, norms[-128:])
    print(f'\n{time.time() - started:.0f} s; uptime after: {uptime()}')


if __name__ == '__main__':
    main()

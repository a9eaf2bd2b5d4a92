"""The full LLVIP recipe on a GPU, in one command (a few minutes).

Trains ``configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py`` (dual
ResNet-50 FPN, MACL, every mmsafe guard) through ``tools/train.py --amp``
on a synthetic tree in LLVIP's released layout at LLVIP's resolution
(1280x1024, created once under ``--data-dir``), validates on its test
split, then measures the recipe's DataLoader alone. Prints:

* the device, s/iter (median of MMEngine's ``time``) and peak GPU memory
  (MMEngine's ``memory``, MiB);
* whether every logged loss is finite and ``loss_macl`` is present, with
  its first and last values;
* the validation metrics (``pascal_voc/mAP``, ``coco/bbox_mAP``, ...);
* paired images/s of the recipe's training loader (its workers, batch
  size and pipeline).

The backbones start from random weights unless ``--pretrained`` (the
ResNet-50 file must then be in the torch hub cache on an offline node).

    python benchmarks/gpu_recipe_check.py                 # CUDA, AMP
    python benchmarks/gpu_recipe_check.py --device cpu --no-amp \\
        --img-size 160 128 --train 8 --test 4 --iters 2   # smoke run
"""
import argparse
import glob
import json
import math
import os
import os.path as osp
import sys
import time

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks._common import machine, median, revision, uptime  # noqa

RECIPE = osp.join(REPO_ROOT, 'configs', 'llvip',
                  'dual_faster_rcnn_r50_fpn_macl_llvip.py')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    parser.add_argument('--no-amp', action='store_true')
    parser.add_argument('--pretrained', action='store_true',
                        help='keep the ImageNet init of the recipe')
    parser.add_argument('--img-size', type=int, nargs=2, default=(1280, 1024))
    parser.add_argument('--train', type=int, default=96,
                        help='synthetic training pairs')
    parser.add_argument('--test', type=int, default=16,
                        help='synthetic test pairs (validation)')
    parser.add_argument('--iters', type=int, default=None,
                        help='train only this many pairs / batch iterations')
    parser.add_argument('--loader-batches', type=int, default=20)
    parser.add_argument('--data-dir', default=osp.join(
        REPO_ROOT, 'data', 'llvip_synthetic_fullres'))
    parser.add_argument('--work-dir', default=osp.join(
        REPO_ROOT, 'work_dirs', 'gpu_recipe_check'))
    parser.add_argument('--timeout', type=float, default=420,
                        help='hard limit of the training run, seconds')
    return parser.parse_args(argv)


def synthetic(args) -> dict:
    width, height = args.img_size
    return dict(num_train=args.train, num_test=args.test,
                img_size=[width, height], seed=0, max_people=5,
                empty_ratio=0.1, person_height=[height / 12, height / 2.5])


def check_config(args) -> str:
    """The recipe on the synthetic tree, written next to the run."""
    root = args.data_dir.rstrip('/') + '/'
    lines = [
        f'_base_ = [{RECIPE!r}]',
        f'synthetic = {synthetic(args)!r}',
        'train_cfg = dict(max_epochs=1, val_interval=1)',
        'default_hooks = dict(logger=dict(interval=1))',
        # per-iteration time and memory, not a moving mean
        'log_processor = dict(window_size=1)',
    ]
    indices = f', indices={args.iters * 4}' if args.iters else ''
    for loader in ('train_dataloader', 'val_dataloader'):
        extra = indices if loader == 'train_dataloader' else ''
        lines.append(f'{loader} = dict(dataset=dict(data_root={root!r}, '
                     f'synthetic=synthetic{extra}))')
    lines.append('test_dataloader = val_dataloader')
    if not args.pretrained:
        lines.append('model = dict(backbone=dict(init_cfg=None), '
                     'ir_backbone=dict(init_cfg=None))')
    if args.device == 'cpu':
        lines.append("env_cfg = dict(dist_cfg=dict(backend='gloo'))")
    os.makedirs(args.work_dir, exist_ok=True)
    path = osp.join(args.work_dir, 'recipe_check.py')
    with open(path, 'w', encoding='utf-8') as f:
        f.write('\n'.join(lines) + '\n')
    return path


def train(args) -> float:
    from tests.utils import run_command
    cmd = [sys.executable, osp.join(REPO_ROOT, 'tools', 'train.py'),
           check_config(args), '--work-dir', args.work_dir]
    if not args.no_amp:
        cmd.append('--amp')
    env = {} if args.device == 'cuda' else {'CUDA_VISIBLE_DEVICES': ''}
    start = time.perf_counter()
    result = run_command(cmd, timeout=args.timeout, env=env)
    elapsed = time.perf_counter() - start
    log = osp.join(args.work_dir, 'train_output.txt')
    os.makedirs(args.work_dir, exist_ok=True)
    with open(log, 'w', encoding='utf-8') as f:
        f.write(result.output)
    if result.timed_out or result.returncode != 0:
        print(result.output[-6000:])
        raise SystemExit(f'training failed (rc={result.returncode}, timed '
                         f'out={result.timed_out}); full output in {log}')
    return elapsed


def scalars(work_dir: str) -> list:
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data',
                                      'scalars.json')), key=osp.getmtime)
    if not files:
        raise SystemExit(f'no scalars.json under {work_dir}')
    with open(files[-1], encoding='utf-8') as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(records: list) -> dict:
    """Figures of a run from its scalars.json records (``train/...`` and
    ``val/...`` keys, MMEngine's hierarchical logging)."""
    train = [r for r in records if 'train/loss' in r]
    losses = {}
    for r in train:
        for k, v in r.items():
            if k.startswith('train/loss'):
                losses.setdefault(k[len('train/'):], []).append(v)
    times = [r['train/time'] for r in train if 'train/time' in r]
    # MMEngine writes the peak GPU memory (MiB) as a top-level 'memory'
    memory = max([r['memory'] for r in train if 'memory' in r],
                 default=float('nan'))
    val = {k[len('val/'):]: v for r in records for k, v in r.items()
           if k.startswith('val/') and not k.endswith('time')}
    return dict(
        iters=len(train), losses=sorted(losses),
        finite=bool(losses) and all(
            math.isfinite(v) for vs in losses.values() for v in vs),
        loss_macl=losses.get('loss_macl', []),
        s_per_iter=median(times[2:] or times), memory=memory, val=val)


def loader_rate(args) -> float:
    """Paired images/s of the recipe's training DataLoader alone."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner

    import mmsafe  # noqa: F401
    cfg = Config.fromfile(check_config(args))
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    loader_cfg = cfg.train_dataloader
    loader_cfg['persistent_workers'] = False
    loader_cfg.pop('batch_sampler', None)
    loader_cfg['sampler'] = dict(type='InfiniteSampler', shuffle=True)
    loader = Runner.build_dataloader(loader_cfg, seed=0)
    iterator = iter(loader)
    next(iterator)  # worker start-up is not part of the rate
    start, pairs = time.perf_counter(), 0
    for _ in range(args.loader_batches):
        batch = next(iterator)
        pairs += len(batch['data_samples'])
    return pairs / (time.perf_counter() - start)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    print(f'uptime before: {uptime()}')
    print(f'machine: {machine()}; revision {revision()}')
    if args.device == 'cuda':
        if not torch.cuda.is_available():
            raise SystemExit('no CUDA device: run with --device cpu for a '
                             'smoke run')
        print(f'device: {torch.cuda.get_device_name(0)}')
    else:
        print('device: cpu')
    from mmsafe.datasets.synthetic_llvip import ensure_synthetic_llvip
    start = time.perf_counter()
    ensure_synthetic_llvip(args.data_dir, **synthetic(args))
    print(f'synthetic LLVIP tree {args.img_size[0]}x{args.img_size[1]}: '
          f'{args.train} train + {args.test} test pairs at {args.data_dir} '
          f'({time.perf_counter() - start:.1f} s)')
    elapsed = train(args)
    summary = summarize(scalars(args.work_dir))
    print(f'training run: {elapsed:.1f} s, {summary["iters"]} logged '
          f'iterations, amp={not args.no_amp}')
    print(f'median s/iter (after 2 warm-up iterations): '
          f'{summary["s_per_iter"]:.4f}')
    print(f'peak memory (MMEngine, MiB): {summary["memory"]}')
    print(f'losses finite: {summary["finite"]} '
          f'({", ".join(summary["losses"])})')
    macl = summary['loss_macl']
    print(f'loss_macl present: {bool(macl)}' + (
        f' (first {macl[0]:.4f}, last {macl[-1]:.4f})' if macl else ''))
    print(f'validation: {json.dumps(summary["val"], sort_keys=True)}')
    print(f'loader paired images/s: {loader_rate(args):.1f}')
    print(f'uptime after: {uptime()}')
    ok = summary['finite'] and bool(macl) and bool(summary['val'])
    print(f'GPU recipe check: {"OK" if ok else "FAILED"}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())

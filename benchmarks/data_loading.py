"""What does the DataLoader fallback (``num_workers=0``) cost?

Paired (visible + infrared) samples per second through the demo's training
pipeline (``configs/llvip/demo_cpu.py``, read at run time: its dataset, its
pipeline, its batch size), with ``--workers`` worker processes and with
``num_workers=0``, on two datasets:

* the demo data (synthetic LLVIP-like tree of the demo config);
* ``--large`` synthetic pairs of ``--large-size`` (default 300 of 640x512,
  LLVIP's size after the usual half-resolution resize), created once under
  ``--data-dir``, with the pipeline's resize scale set to that size.

Rounds alternate (workers, 0, 0, workers, ...) so both settings see the
same machine load. Each round builds a fresh loader and reads
``--batches`` batches; the time to the first batch (worker start-up) is
reported apart from the steady rate, which starts at the first batch.

    python benchmarks/data_loading.py
    python benchmarks/data_loading.py --rounds 2 --batches 20 --large 100
"""
import argparse
import copy
import os
import os.path as osp
import sys
import time

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks._common import (DEMO_CONFIG, machine, median,  # noqa
                                revision, uptime)


def loader_cfg(base: dict, num_workers: int) -> dict:
    cfg = copy.deepcopy(base)
    cfg['num_workers'] = num_workers
    cfg['persistent_workers'] = False
    cfg.pop('batch_sampler', None)
    # an endless sampler: every round reads as many batches as it asks for
    cfg['sampler'] = dict(type='InfiniteSampler', shuffle=True, seed=0)
    return cfg


def one_round(cfg: dict, batches: int) -> dict:
    from mmengine.runner import Runner
    loader = Runner.build_dataloader(cfg, seed=0)
    start = time.perf_counter()
    iterator = iter(loader)
    batch = next(iterator)
    first = time.perf_counter() - start
    batch_size = len(batch['data_samples'])
    steady_start = time.perf_counter()
    samples = 0
    for _ in range(batches):
        batch = next(iterator)
        samples += len(batch['data_samples'])
    steady = time.perf_counter() - steady_start
    del iterator, loader  # stops the workers
    return dict(first_batch_s=first, samples_per_s=samples / steady,
                batch_size=batch_size)


def measure(name: str, base: dict, workers: int, rounds: int,
            batches: int) -> None:
    results = {workers: [], 0: []}
    for r in range(rounds):
        order = (workers, 0) if r % 2 == 0 else (0, workers)
        for n in order:
            results[n].append(one_round(loader_cfg(base, n), batches))
    w = median([x['samples_per_s'] for x in results[workers]])
    z = median([x['samples_per_s'] for x in results[0]])
    print(f'\n== {name}: batch {results[0][0]["batch_size"]}, '
          f'{rounds} rounds x {batches} batches per setting ==')
    print(f'num_workers={workers}: {w:.1f} pairs/s (first batch after '
          f'{median([x["first_batch_s"] for x in results[workers]]):.2f} s)')
    print(f'num_workers=0: {z:.1f} pairs/s (first batch after '
          f'{median([x["first_batch_s"] for x in results[0]]):.2f} s)')
    print(f'fallback cost: num_workers=0 reaches {z / w:.2f}x the '
          f'throughput of num_workers={workers}')


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=4,
                        help='rounds per setting (alternating)')
    parser.add_argument('--batches', type=int, default=40,
                        help='timed batches per round')
    parser.add_argument('--large', type=int, default=300,
                        help='number of large synthetic pairs (0: skip)')
    parser.add_argument('--large-size', type=int, nargs=2,
                        default=(640, 512), metavar=('W', 'H'))
    parser.add_argument('--data-dir', default=osp.join(
        REPO_ROOT, 'work_dirs', 'bench_data'))
    args = parser.parse_args()
    os.chdir(REPO_ROOT)  # the demo's data_root is relative to the repo
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    import mmsafe  # noqa: F401  (registers the paired dataset/transforms)
    init_default_scope('mmdet')
    cfg = Config.fromfile(DEMO_CONFIG)
    base = cfg.train_dataloader.to_dict()
    print(f'machine: {machine()}')
    print(f'revision: {revision()}')
    print(f'uptime before: {uptime()}')
    measure(f'demo data ({cfg.get("img_scale", "demo")} pairs)', base,
            args.workers, args.rounds, args.batches)
    if args.large > 0:
        w, h = args.large_size
        large = copy.deepcopy(base)
        root = osp.join(args.data_dir, f'llvip_{w}x{h}_{args.large}') + '/'
        large['dataset']['data_root'] = root
        large['dataset']['synthetic'] = dict(
            num_train=args.large, num_test=4, img_size=(w, h), seed=0)
        for step in large['dataset']['pipeline']:
            if 'scale' in step:
                step['scale'] = (w, h)
        start = time.perf_counter()
        from mmsafe.datasets import ensure_synthetic_llvip
        ensure_synthetic_llvip(root, **large['dataset']['synthetic'])
        print(f'\n(large pairs ready at {root} after '
              f'{time.perf_counter() - start:.1f} s)')
        measure(f'{args.large} synthetic {w}x{h} pairs', large,
                args.workers, args.rounds, args.batches)
    print(f'\nuptime after: {uptime()}')


if __name__ == '__main__':
    main()

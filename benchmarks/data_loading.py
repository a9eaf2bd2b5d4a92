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

Full vs reduced JPEG decoding (``--decode`` pairs, default 40 of
``--decode-size`` 1280x1024, LLVIP's size, synthetic JPEGs created once
under ``--data-dir`` and re-encoded at each ``--decode-quality``: the
decode cost follows the bits per pixel): paired samples/s of one worker
(the LLVIP recipe's training pipeline, ``configs/_base_/datasets/llvip.py``,
run over every pair with single-threaded OpenCV, as a DataLoader worker
runs it) with the recipe's ``reduced_decode`` and with it off, each with
and without the recipe's ``KeepFreedMemory`` step. Each setting runs in a
fresh process of its own per round (``--decode-rounds``, the order of the
settings rotated), as each training's workers run one setting: what a
process ran before changes its allocator's state, hence its page faults.
Rates are the medians over the rounds of each process's median pass
(``--decode-passes``, after a first untimed pass). ``--decode-data DIR``
runs the same comparison on the first ``--decode`` train pairs of a real
tree in LLVIP's layout (``visible/train``, ``infrared/train``,
``Annotations``) instead, its JPEGs as they are stored.

    python benchmarks/data_loading.py
    python benchmarks/data_loading.py --rounds 2 --batches 20 --large 100
    python benchmarks/data_loading.py --large 0 --rounds 0 --decode 40
    python benchmarks/data_loading.py --large 0 --rounds 0 --decode 500 \
        --decode-data data/LLVIP/

Each rate is given by the wall clock and by the measuring process's CPU
time (less exposed to the other processes of a shared machine), with the
minor page faults per pair: a full decode writes 4 MB per image, and what
a page fault costs differs between machines (a virtual machine's cost
more). ``--ir-color-type grayscale`` decodes the infrared images as grey
(every setting).

``--stages`` adds, per JPEG quality, the milliseconds per pair of each
transform of that pipeline for each setting (the transforms timed one by
one as the dataset's pipeline runs them): where the time of a pair goes.
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


LLVIP_BASE = osp.join(REPO_ROOT, 'configs', '_base_', 'datasets',
                      'llvip.py')


def stage_pass(dataset) -> dict:
    """Seconds per pair of each transform of ``dataset``'s pipeline over
    one pass (the transforms called in turn, as the pipeline calls them)."""
    transforms = dataset.pipeline.transforms
    spent = [0.0] * len(transforms)
    for i in range(len(dataset)):
        data = dataset.get_data_info(i)
        for k, t in enumerate(transforms):
            start = time.perf_counter()
            data = t(data)
            spent[k] += time.perf_counter() - start
    return {f'{k} {type(t).__name__}': s / len(dataset)
            for k, (t, s) in enumerate(zip(transforms, spent))}


#: the decode comparison's settings: (reduced decode, KeepFreedMemory)
SETTINGS = {
    'full decode': (False, False),
    'reduced decode': (True, False),
    'full decode + KeepFreedMemory': (False, True),
    'reduced decode + KeepFreedMemory (the recipe)': (True, True),
}
CHILD_MARK = 'DECODE-CHILD '


def decode_pass(dataset) -> tuple:
    """One pass over ``dataset`` in this process: paired samples/s by the
    wall clock and by this process's CPU time, and minor page faults per
    pair."""
    import resource
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(len(dataset)):
        dataset[i]
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return (len(dataset) / wall, len(dataset) / max(cpu, 1e-9),
            faults / len(dataset))


def decode_dataset(root: str, reduced: bool, keep: bool,
                   ir_color_type: str = None, num: int = None):
    """The LLVIP recipe's training dataset on ``root`` (its first ``num``
    pairs, by file name, when given): its pipeline with its
    ``reduced_decode`` or a full decode, with or without its
    ``KeepFreedMemory`` step (``ir_color_type``, when given, replaces the
    recipe's)."""
    from mmengine.config import Config
    from mmdet.registry import DATASETS
    cfg = Config.fromfile(LLVIP_BASE)
    pipeline = [p for p in copy.deepcopy(cfg.train_pipeline)
                if p['type'] != 'KeepFreedMemory']
    pipeline[0]['reduced_decode'] = cfg.reduced_decode if reduced else None
    if ir_color_type is not None:
        pipeline[0]['ir_color_type'] = ir_color_type
    if keep:
        pipeline.append(dict(type='KeepFreedMemory'))
    return DATASETS.build(dict(
        type='mmsafe.LLVIPDataset', data_root=root, filter_cfg=None,
        data_prefix=dict(img='visible/train/', ir_img='infrared/train/',
                         ann='Annotations/'), pipeline=pipeline,
        indices=num))


def decode_child(args) -> None:
    """One setting in this fresh process, as one DataLoader worker runs
    it: a first pass (file cache, and the allocator setting when the step
    is there), then ``--decode-passes`` timed passes; prints the medians
    as one JSON line."""
    import json

    import cv2
    # what a DataLoader worker runs with (MMEngine's env_cfg
    # opencv_num_threads=0): single-threaded OpenCV
    cv2.setNumThreads(0)
    reduced, keep = SETTINGS[args.decode_child]
    dataset = decode_dataset(args.decode_root, reduced, keep,
                             args.ir_color_type, args.decode)
    decode_pass(dataset)
    passes = [decode_pass(dataset) for _ in range(args.decode_passes)]
    out = dict(pairs=len(dataset), wall=median([p[0] for p in passes]),
               cpu=median([p[1] for p in passes]),
               faults=median([p[2] for p in passes]))
    if args.stages:
        stages = [stage_pass(dataset) for _ in range(args.decode_passes)]
        out['stages'] = {name: median([s[name] for s in stages])
                         for name in stages[0]}
    print(CHILD_MARK + json.dumps(out), flush=True)


def run_child(setting: str, root: str, args) -> dict:
    import json
    import subprocess
    cmd = [sys.executable, osp.abspath(__file__), '--decode-child', setting,
           '--decode-root', root, '--decode-passes', str(args.decode_passes),
           '--decode', str(args.decode)]
    if args.ir_color_type is not None and setting in SETTINGS:
        cmd += ['--ir-color-type', args.ir_color_type]
    if args.stages and setting in SETTINGS:
        cmd.append('--stages')
    proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    lines = [line for line in proc.stdout.splitlines()
             if line.startswith(CHILD_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f'{setting}: the measuring process failed '
                           f'(exit {proc.returncode}):\n{proc.stdout}')
    return json.loads(lines[-1][len(CHILD_MARK):])


def jpeg_tree(src: str, quality: int) -> str:
    """A copy of the synthetic tree ``src`` with its JPEGs re-encoded at
    ``quality`` (created once); the decode cost follows the bits per
    pixel."""
    import shutil

    import cv2
    dst = f'{src.rstrip("/")}_q{quality}/'
    if osp.isdir(dst):
        return dst
    tmp = dst.rstrip('/') + f'.tmp{os.getpid()}'
    shutil.copytree(src, tmp)
    for modality in ('visible', 'infrared'):
        folder = osp.join(tmp, modality, 'train')
        for name in os.listdir(folder):
            path = osp.join(folder, name)
            img = cv2.imread(path, cv2.IMREAD_UNCHANGED)
            assert cv2.imwrite(path, img, [cv2.IMWRITE_JPEG_QUALITY,
                                           quality]), path
    os.rename(tmp, dst.rstrip('/'))
    return dst


def train_files(root: str, modality: str, num: int) -> list:
    """The first ``num`` train images of ``modality`` by file name (the
    order of the dataset's pairs)."""
    folder = osp.join(root, modality, 'train')
    return [osp.join(folder, n) for n in sorted(os.listdir(folder))[:num]]


def bits_per_pixel(root: str, num: int) -> tuple:
    """Image size (W, H) of the first visible train image, and the median
    bits per pixel of the first ``num`` visible and infrared images."""
    from PIL import Image
    files = {m: train_files(root, m, num) for m in ('visible', 'infrared')}
    with Image.open(files['visible'][0]) as img:
        w, h = img.size
    return (w, h), {m: 8 * median([osp.getsize(f) for f in paths]) / (w * h)
                    for m, paths in files.items()}


def measure_decode(num: int, size, args) -> None:
    """Full vs reduced decoding through the LLVIP recipe's pipeline, with
    and without its ``KeepFreedMemory`` step: each setting in its own
    process per round (a process's allocator state depends on what it ran
    before), the settings' order rotated from round to round; on
    synthetic JPEG pairs of ``size`` re-encoded at each quality, or on the
    first ``num`` pairs of ``--decode-data``."""
    from mmengine.config import Config
    cfg = Config.fromfile(LLVIP_BASE)
    if args.decode_data:
        # a real tree, its files as they are stored
        roots = {'files as stored': args.decode_data}
    else:
        from mmsafe.datasets import ensure_synthetic_llvip
        w, h = size
        src = osp.join(args.data_dir, f'llvip_{w}x{h}_{num}_jpeg') + '/'
        start = time.perf_counter()
        ensure_synthetic_llvip(src, num_train=num, num_test=2,
                               img_size=(w, h), seed=0,
                               person_height=(60, min(500, h - 8)))
        roots = {f'JPEG quality {q}': jpeg_tree(src, q)
                 for q in args.decode_quality}
        print(f'\n({num} synthetic JPEG pairs of {w}x{h} ready at {src}_q* '
              f'after {time.perf_counter() - start:.1f} s)')
    scale = cfg.reduced_decode['scale']
    names = [n for n in SETTINGS if n in args.decode_settings]
    codecs = [n for n in CODEC if n in args.decode_settings]
    for files, root in roots.items():
        (w, h), bpp = bits_per_pixel(root, num)
        pairs = len(train_files(root, 'visible', num))
        where = f' from {root}' if args.decode_data else ''
        ir = '' if args.ir_color_type is None else \
            f', ir_color_type={args.ir_color_type!r}'
        print(f'\n== full vs reduced JPEG decode: LLVIP recipe train '
              f'pipeline at {scale[0]}x{scale[1]}, {pairs} pairs of '
              f'{w}x{h}{where}, {files} ({bpp["visible"]:.2f} | '
              f'{bpp["infrared"]:.2f} bits/pixel, visible | infrared), one '
              f'process per setting and round (one DataLoader worker\'s '
              f'work), {args.decode_rounds} rounds x {args.decode_passes} '
              f'passes{ir} ==')
        runs = {n: [] for n in names}
        for r in range(args.decode_rounds if names else 0):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in (order if r % 2 == 0 else order[::-1]):
                runs[name].append(run_child(name, root, args))
        measured = {x['pairs'] for n in names for x in runs[n]}
        if names and measured != {pairs}:
            raise RuntimeError(f'the measuring processes ran {measured} '
                               f'pairs, not {pairs}')
        rate = {n: {k: median([x[k] for x in runs[n]])
                    for k in ('wall', 'cpu', 'faults')} for n in names}
        if names:
            width = max(len(n) for n in names)
            print(f'{"setting":<{width}}  pairs/s per worker (wall | CPU)  '
                  'page faults per pair')
        for n in names:
            print(f'{n:<{width}}  {rate[n]["wall"]:7.1f} | '
                  f'{rate[n]["cpu"]:7.1f}  {rate[n]["faults"]:8.0f}')

        def ratio(a: str, b: str, what: str) -> None:
            if a in rate and b in rate:  # both settings ran
                print(f'{what}: {rate[a]["wall"] / rate[b]["wall"]:.2f}x '
                      f'(CPU {rate[a]["cpu"] / rate[b]["cpu"]:.2f}x)')

        full, red, full_k, red_k = SETTINGS
        ratio(red, full, 'reduced/full, allocator as it is')
        ratio(red_k, full_k, 'reduced/full, both with KeepFreedMemory')
        ratio(full_k, full, 'KeepFreedMemory, full decode')
        ratio(red_k, red, 'KeepFreedMemory, reduced decode')
        ratio(red_k, full, 'the recipe / full decode as it is')
        if args.stages and names:
            print('per transform, ms per pair (median over the rounds of '
                  'each process\'s median pass): ' + ' | '.join(names))
            for stage in runs[names[0]][0]['stages']:
                cells = [median([x['stages'][stage] for x in runs[n]]) * 1e3
                         for n in names]
                print(f'  {stage}: ' + ' | '.join(f'{c:.2f}' for c in cells))
        if len(codecs) < len(CODEC):  # the line compares both
            continue
        codec = {n: [] for n in CODEC}
        for r in range(args.decode_rounds):
            for name in (list(CODEC) if r % 2 == 0 else list(CODEC)[::-1]):
                codec[name].append(run_child(name, root, args))
        full, red = ({k: median([x[k] for x in codec[n]])
                      for k in ('wall', 'cpu')} for n in CODEC)
        print(f'OpenCV alone, without page faults (a process keeping freed '
              f'memory): decode + resize {full["wall"]:.1f}, reduced decode '
              f'{red["wall"]:.1f} images/s; reduced/full: '
              f'{red["wall"] / full["wall"]:.2f}x (CPU '
              f'{red["cpu"] / full["cpu"]:.2f}x)')


#: OpenCV alone, in a process that keeps freed memory: the decoders' work
CODEC = {'OpenCV decode + resize': False, 'OpenCV reduced decode': True}


def codec_child(args) -> None:
    """``cv2.imdecode`` + ``cv2.resize`` to the recipe's scale, or
    ``IMREAD_REDUCED_COLOR_2`` alone, over the tree's train images in this
    process, with the allocator keeping freed memory (no page faults: the
    decoders' own work); prints images/s (median pass) as one JSON line."""
    import json

    import cv2
    import numpy as np
    from mmengine.config import Config
    from mmsafe.datasets.loader.allocator import keep_freed_memory
    keep_freed_memory()
    cv2.setNumThreads(0)
    scale = tuple(Config.fromfile(LLVIP_BASE).reduced_decode['scale'])
    bufs = [np.fromfile(path, np.uint8)
            for modality in ('visible', 'infrared')
            for path in train_files(args.decode_root, modality, args.decode)]

    def full(buf):
        cv2.resize(cv2.imdecode(buf, cv2.IMREAD_COLOR), scale,
                   interpolation=cv2.INTER_LINEAR)

    def reduced(buf):
        cv2.imdecode(buf, cv2.IMREAD_REDUCED_COLOR_2)

    fn = reduced if CODEC[args.decode_child] else full
    rates = []
    for p in range(args.decode_passes + 1):
        start, cpu = time.perf_counter(), time.process_time()
        for buf in bufs:
            fn(buf)
        if p:
            rates.append((len(bufs) / (time.perf_counter() - start),
                          len(bufs) / max(time.process_time() - cpu, 1e-9)))
    print(CHILD_MARK + json.dumps(dict(
        wall=median([r[0] for r in rates]),
        cpu=median([r[1] for r in rates]))), flush=True)


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
    parser.add_argument('--decode', type=int, default=40,
                        help='JPEG pairs for full vs reduced decode (0: '
                        'skip)')
    parser.add_argument('--decode-size', type=int, nargs=2,
                        default=(1280, 1024), metavar=('W', 'H'))
    parser.add_argument('--decode-rounds', type=int, default=5,
                        help='processes per decode setting (rounds, the '
                        'order rotated)')
    parser.add_argument('--decode-passes', type=int, default=3,
                        help='timed passes in each process')
    parser.add_argument('--decode-data', metavar='DIR',
                        help='decode comparison on the first --decode train '
                        'pairs of this tree in LLVIP\'s layout (e.g. '
                        'data/LLVIP/), its JPEGs as stored, instead of '
                        'synthetic ones')
    parser.add_argument('--decode-quality', type=int, nargs='+',
                        default=(92, 75),
                        help='JPEG qualities of the decode comparison')
    parser.add_argument('--ir-color-type', default=None,
                        choices=('color', 'grayscale'),
                        help='decode comparison: the infrared loader\'s '
                        'ir_color_type on both sides (default: the '
                        'recipe\'s)')
    parser.add_argument('--decode-settings', nargs='+', metavar='SETTING',
                        choices=list(SETTINGS) + list(CODEC),
                        default=list(SETTINGS) + list(CODEC),
                        help='the decode comparison\'s settings to measure '
                        '(default: all of %(choices)s); a ratio is printed '
                        'when the settings it compares ran, the OpenCV '
                        'alone line when both of its settings are chosen')
    parser.add_argument('--stages', action='store_true',
                        help='also time each transform of the decode '
                        'comparison\'s pipeline (ms per pair)')
    # one setting measured in this process (run by the comparison)
    parser.add_argument('--decode-child', choices=list(SETTINGS) +
                        list(CODEC),
                        help=argparse.SUPPRESS)
    parser.add_argument('--decode-root', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.decode_data and not osp.isdir(
            osp.join(args.decode_data, 'visible', 'train')):
        parser.error(f'--decode-data {args.decode_data}: no visible/train '
                     'folder there (LLVIP\'s layout: visible/train, '
                     'infrared/train, Annotations)')
    os.chdir(REPO_ROOT)  # the demo's data_root is relative to the repo
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    import mmsafe  # noqa: F401  (registers the paired dataset/transforms)
    init_default_scope('mmsafe')  # the scope of mmsafe's configs
    if args.decode_child in CODEC:
        codec_child(args)
        return
    if args.decode_child:
        decode_child(args)
        return
    cfg = Config.fromfile(DEMO_CONFIG)
    base = cfg.train_dataloader.to_dict()
    print(f'machine: {machine()}')
    print(f'revision: {revision()}')
    print(f'uptime before: {uptime()}')
    if args.rounds > 0:
        measure(f'demo data ({cfg.get("img_scale", "demo")} pairs)', base,
                args.workers, args.rounds, args.batches)
    if args.large > 0 and args.rounds > 0:
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
    if args.decode > 0:
        measure_decode(args.decode, args.decode_size, args)
    print(f'\nuptime after: {uptime()}')


if __name__ == '__main__':
    main()

"""Where the LLVIP recipe's training time goes, and what each speed lever
buys: several variants ("arms") of the recipe side by side in one run.

Each arm trains ``configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py``
(dual ResNet-50 FPN, MACL, every mmsafe guard; ``--config`` for another
LLVIPDataset config) through ``tools/train.py``
in a process of its own, on the synthetic tree in LLVIP's layout that
``gpu_recipe_check.py`` makes (LLVIP's 1280x1024 by default), with
``benchmarks/stage_profile_hook.py`` measuring consecutive windows of the
run: warm-up, a timed window with nothing added (paired samples/s,
s/iteration, data wait), a split window (each part of an iteration by the
host clock and, on CUDA, by the stream time between CUDA events), a count
window (host synchronisations per iteration by origin: mmsafe's model
code, MMDetection's, mmsafe's guards, MMEngine) and, on CUDA, a profiled
window (GPU busy fraction). Rounds run every arm once each, the order
rotated; figures are medians over rounds.

An arm is ``recipe`` (the recipe as released) or levers joined by ``+``:

* ``no-guards``: the same model and data without mmsafe's guards
  (MMEngine's ``Runner``, its plain optim wrapper, no mmsafe hook);
* ``cudnn``: ``env_cfg.cudnn_benchmark=True`` (the input size is fixed);
* ``channels_last``: the model's ``channels_last=True`` (NHWC weights and
  inputs);
* ``bf16``: autocast in bfloat16 instead of float16 (with ``--amp``);
* ``batch8`` / ``batch16``: 8 or 16 pairs per iteration with MMEngine's
  ``auto_scale_lr`` (linear rule from the recipe's ``base_batch_size``);
* ``pin``: pinned loader memory and non-blocking copies to the device;
* ``workers4`` / ``workers8``: loader worker processes;
* ``fused``: the optimizer's fused CUDA step (torch versions whose SGD
  has ``fused``; refused otherwise).

    python benchmarks/recipe_profile.py                  # CUDA, AMP
    python benchmarks/recipe_profile.py --arms recipe no-guards \\
        cudnn+channels_last+pin cudnn+channels_last+bf16+batch8+pin
    python benchmarks/recipe_profile.py --device cpu --no-amp \\
        --img-size 160 128 --train 24 --warmup 1 --timed 2 --split 1 \\
        --count 1 --arms recipe no-guards                # smoke run
"""
import argparse
import json
import os
import os.path as osp
import sys
import time

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks._common import machine, median, revision, uptime  # noqa
from benchmarks.gpu_recipe_check import RECIPE, scalars, summarize  # noqa
from benchmarks.gpu_recipe_check import parse_args as gpu_recipe_check_args
from benchmarks.gpu_recipe_check import synthetic  # noqa

LEVERS = ('no-guards', 'cudnn', 'channels_last', 'bf16', 'batch8',
          'batch16', 'pin', 'workers4', 'workers8', 'fused')
DEFAULT_ARMS = ('recipe', 'no-guards', 'cudnn+channels_last+pin',
                'cudnn+channels_last+pin+bf16+batch8')
HOOK_MODULE = 'benchmarks.stage_profile_hook'
#: the split window's parts, in the order an iteration runs them
PART_ORDER = ('data preprocessor', 'visible backbone', 'infrared backbone',
              'necks', 'fusion', 'RPN head (loss)', 'RoI head (loss)',
              'MACL head (loss)', 'forward, rest', 'backward',
              'optimizer step', 'zero_grad')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument('--arms', nargs='+', default=list(DEFAULT_ARMS))
    parser.add_argument('--config', default=RECIPE,
                        help='the config to profile (an LLVIPDataset config; '
                        'default: the LLVIP recipe)')
    parser.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    parser.add_argument('--no-amp', action='store_true')
    parser.add_argument('--img-size', type=int, nargs=2, default=(1280, 1024))
    parser.add_argument('--scale', type=int, nargs=2, default=None,
                        metavar=('W', 'H'),
                        help='the pipelines\' resize scale (default: the '
                        'recipe\'s, 640x512)')
    parser.add_argument('--train', type=int, default=96,
                        help='synthetic training pairs (the loader cycles '
                        'through them)')
    parser.add_argument('--test', type=int, default=16,
                        help='synthetic test pairs (one validation at the '
                        'end)')
    parser.add_argument('--warmup', type=int, default=15)
    parser.add_argument('--timed', type=int, default=40)
    parser.add_argument('--split', type=int, default=8)
    parser.add_argument('--count', type=int, default=2)
    parser.add_argument('--profile', type=int, default=5,
                        help='profiled iterations (CUDA only)')
    parser.add_argument('--rounds', type=int, default=1)
    parser.add_argument('--data-dir', default=None,
                        help='the synthetic tree (default: '
                        'gpu_recipe_check\'s with its sizes, else under '
                        'data/, named by its sizes)')
    parser.add_argument('--work-dir', default=osp.join(
        REPO_ROOT, 'work_dirs', 'recipe_profile'))
    parser.add_argument('--timeout', type=float, default=300,
                        help='hard limit of one arm\'s training, seconds')
    args = parser.parse_args(argv)
    for arm in args.arms:
        levers(arm)  # an unknown lever fails before anything runs
    if args.data_dir is None:
        checker = gpu_recipe_check_args([])
        same = [tuple(args.img_size), args.train, args.test] == [
            tuple(checker.img_size), checker.train, checker.test]
        w, h = args.img_size
        args.data_dir = checker.data_dir if same else osp.join(
            REPO_ROOT, 'data',
            f'llvip_synthetic_{w}x{h}_{args.train}_{args.test}')
    return args


def levers(arm: str) -> list:
    if arm == 'recipe':
        return []
    names = arm.split('+')
    unknown = [n for n in names if n not in LEVERS]
    if unknown:
        raise SystemExit(f'arm {arm!r}: unknown lever(s) {unknown}; known: '
                         f'recipe or {", ".join(LEVERS)} joined by +')
    return names


def iterations(args) -> int:
    profile = args.profile if args.device == 'cuda' else 0
    return args.warmup + args.timed + args.split + args.count + profile


def guards_off(cfg) -> None:
    """The recipe without mmsafe's guards: MMEngine's Runner and plain
    optim wrapper, no mmsafe hook (the model and data stay mmsafe's)."""
    from benchmarks._overhead_worker import (_NAN_SKIP_ONLY_KEYS,
                                             _PLAIN_WRAPPER, _is_mmsafe_hook)
    cfg.runner_type = 'Runner'
    cfg.custom_hooks = [h for h in cfg.get('custom_hooks', []) or []
                        if not _is_mmsafe_hook(h)]
    wrapper = cfg.optim_wrapper
    wrapper.type = _PLAIN_WRAPPER.get(wrapper.type, wrapper.type)
    for key in _NAN_SKIP_ONLY_KEYS:
        wrapper.pop(key, None)


def apply_lever(cfg, name: str, args) -> None:
    if name == 'no-guards':
        guards_off(cfg)
    elif name == 'cudnn':
        cfg.env_cfg.cudnn_benchmark = True
    elif name == 'channels_last':
        cfg.model.channels_last = True
    elif name == 'bf16':
        if args.no_amp:
            raise SystemExit('lever bf16: autocast is off (--no-amp)')
        cfg.optim_wrapper.dtype = 'bfloat16'
    elif name.startswith('batch'):
        if not cfg.get('auto_scale_lr'):
            cfg.auto_scale_lr = dict(
                base_batch_size=cfg.train_dataloader.batch_size)
        cfg.train_dataloader.batch_size = int(name[len('batch'):])
        cfg.auto_scale_lr.enable = True
    elif name == 'pin':
        cfg.train_dataloader.pin_memory = True
        cfg.model.data_preprocessor.non_blocking = True
    elif name.startswith('workers'):
        cfg.train_dataloader.num_workers = int(name[len('workers'):])
    elif name == 'fused':
        from mmsafe.compat import sgd_has_fused
        if not sgd_has_fused():
            raise SystemExit('lever fused: this torch\'s SGD has no fused '
                             'step')
        cfg.optim_wrapper.optimizer.fused = True


def set_scale(cfg, scale) -> None:
    """Every resize (and reduced decode) of the loaders' pipelines to
    ``scale``."""
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        for step in cfg[loader].dataset.pipeline:
            if 'scale' in step:
                step.scale = tuple(scale)
            if step.get('reduced_decode'):
                step.reduced_decode.scale = tuple(scale)


def arm_config(arm: str, args) -> str:
    """The recipe with the arm's levers, on the synthetic tree, measured by
    the stage profile hooks; written to the arm's work dir."""
    from mmengine.config import Config

    import mmsafe  # noqa: F401  (the hook types looked up by guards_off)
    cfg = Config.fromfile(args.config)
    root = args.data_dir.rstrip('/') + '/'
    data = synthetic(args)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.update(data_root=root, synthetic=data)
    if args.scale:
        set_scale(cfg, args.scale)
    # one loop over the windows, the loader cycling through the tree
    # without epoch boundaries; one validation at the end
    total = iterations(args)
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=total,
                         val_interval=total)
    cfg.log_processor = dict(cfg.get('log_processor', {}) or {},
                             by_epoch=False)
    for key in ('backbone', 'ir_backbone'):
        if cfg.model.get(key):
            cfg.model[key].init_cfg = None  # no download
    # losses logged (and checked) at least twice, at most every 10 steps
    cfg.default_hooks.logger.interval = max(1, min(10, total // 2))
    # no checkpoint: a save is not part of an iteration
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False,
                                        interval=10**6, save_last=False)
    cfg.custom_hooks = list(cfg.get('custom_hooks', []) or [])
    imports = list(cfg.custom_imports.get('imports', []))
    cfg.custom_imports = dict(imports=imports + [HOOK_MODULE],
                              allow_failed_imports=False)
    for name in levers(arm):
        apply_lever(cfg, name, args)
    profile = args.profile if args.device == 'cuda' else 0
    cfg.custom_hooks = list(cfg.custom_hooks) + [
        dict(type='StageProfileHook', warmup=args.warmup, timed=args.timed,
             split=args.split, count=args.count, profile=profile),
        dict(type='StageProfileEndHook')]
    if args.device == 'cpu':
        cfg.env_cfg.dist_cfg = dict(backend='gloo')
    cfg.experiment_name = arm.replace('+', '_')
    work_dir = osp.join(args.work_dir, cfg.experiment_name)
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, 'arm_config.py')
    cfg.dump(path)
    return path


def run_arm(arm: str, args, round_index: int) -> dict:
    from tests.utils import run_command
    config = arm_config(arm, args)
    work_dir = osp.join(osp.dirname(config), f'round{round_index}')
    cmd = [sys.executable, osp.join(REPO_ROOT, 'tools', 'train.py'), config,
           '--work-dir', work_dir]
    if not args.no_amp:
        cmd.append('--amp')
    env = {'PYTHONPATH': os.pathsep.join(
        [REPO_ROOT] + [p for p in [os.environ.get('PYTHONPATH')] if p])}
    if args.device == 'cpu':
        env['CUDA_VISIBLE_DEVICES'] = ''
    start = time.perf_counter()
    result = run_command(cmd, timeout=args.timeout, env=env)
    elapsed = time.perf_counter() - start
    with open(osp.join(work_dir, 'train_output.txt'), 'w',
              encoding='utf-8') as f:
        f.write(result.output)
    profile = osp.join(work_dir, 'stage_profile.json')
    if result.timed_out or result.returncode != 0:
        print(result.output[-6000:])
        raise SystemExit(f'arm {arm!r} failed (rc={result.returncode}, timed '
                         f'out={result.timed_out}); full output in '
                         f'{work_dir}/train_output.txt')
    if not osp.isfile(profile):
        raise SystemExit(f'arm {arm!r}: the training ended without the '
                         f'profile of its {iterations(args)} iterations; '
                         f'output in {work_dir}/train_output.txt')
    with open(profile, encoding='utf-8') as f:
        stages = json.load(f)
    stages['run'] = summarize(scalars(work_dir))
    stages['process_s'] = elapsed
    return stages


def split_table(split: list) -> dict:
    """Median ms per iteration of each part (host, device), with the rest
    of ``train_step``'s forward and the guards' hook methods."""
    labels = {label for it in split for label in it}
    table = {}
    for label in labels:
        table[label] = {
            kind: median([it.get(label, {}).get(kind, 0.0) for it in split])
            for kind in ('host_ms', 'device_ms')}
    if 'train_step' in table:
        nested = [lab for lab in labels
                  if lab != 'train_step' and not lab.startswith('guard ')]
        table['forward, rest'] = {
            kind: table['train_step'][kind] - sum(table[lab][kind]
                                                  for lab in nested)
            for kind in ('host_ms', 'device_ms')}
    guards = [lab for lab in labels if lab.startswith('guard ')]
    table['guards (mmsafe hooks), total'] = {
        kind: sum(table[lab][kind] for lab in guards)
        for kind in ('host_ms', 'device_ms')}
    return table


def report(arm: str, runs: list, cuda: bool, baseline: dict) -> dict:
    first = runs[0]
    rate = median([r['pairs_per_s'] for r in runs])
    s_iter = median([r['s_per_iter'] for r in runs])
    wait = median([median(r['data_wait_ms']) for r in runs])
    print(f'\n== arm {arm}: runner {first["runner"]}, optim wrapper '
          f'{first["optim_wrapper"]}, cudnn_benchmark '
          f'{first["cudnn_benchmark"]}, channels-last weights '
          f'{first["channels_last_weights"]}, {len(first["guards"])} mmsafe '
          'hooks, '
          f'batch {round(first["pairs"] / first["windows"]["timed"])}, '
          f'{len(runs)} round(s) ==')
    print(f'paired samples/s: {rate:.2f}; s/iteration: {s_iter:.4f}; data '
          f'wait: {wait:.2f} ms/iteration (median)')
    if baseline:
        print(f'vs recipe: {rate / baseline["rate"]:.2f}x paired samples/s')
    if cuda:
        busy = [r['gpu_busy'] for r in runs if r.get('gpu_busy') is not None]
        print('GPU busy fraction (kernel time / wall, profiled window): ' + (
            f'{median(busy):.3f}' if busy else 'not measured (the profiler '
            'reported no CUDA kernel)'))
        print(f'peak memory: '
              f'{max(r.get("peak_memory_mib", 0) for r in runs):.0f} MiB')
    table = split_table([it for r in runs for it in r['split']])
    kinds = 'host | stream' if cuda else 'host'
    print(f'split, ms/iteration ({kinds}; median over '
          f'{sum(len(r["split"]) for r in runs)} iterations):')
    order = [p for p in PART_ORDER if p in table] + ['train_step'] + sorted(
        p for p in table if p.startswith('guard'))
    for part in order:
        if part not in table:
            continue
        cell = f'{table[part]["host_ms"]:8.2f}'
        if cuda:
            cell += f' | {table[part]["device_ms"]:8.2f}'
        print(f'  {part:<40s}{cell}')
    for key, what in (('conversions', 'tensor-to-host conversions'),
                      ('cuda_syncs', 'synchronising CUDA calls')):
        if key == 'cuda_syncs' and not cuda:
            continue
        by_kind = first.get(f'{key}_by_kind', {})
        total = sum(by_kind.values())
        parts = ', '.join(f'{k} {v:.1f}' for k, v in sorted(by_kind.items()))
        print(f'{what} per iteration: {total:.1f} ({parts or "none"})')
        # the sites in the model's code and in mmsafe's guards
        sites = {s: n for s, n in first.get(key, {}).items()
                 if s.split(' @ ')[-1].startswith(('model (',
                                                   'guards (mmsafe)'))}
        for site, n in sorted(sites.items(), key=lambda x: -x[1])[:10]:
            print(f'    {n:5.1f}  {site}')
    run = first['run']
    macl = run['loss_macl']
    print(f'losses finite: {run["finite"]}; loss_macl present: {bool(macl)}')
    return dict(rate=rate, ok=run['finite'] and bool(macl))


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    os.chdir(REPO_ROOT)
    print(f'uptime before: {uptime()}')
    print(f'machine: {machine()}; revision {revision()}')
    cuda = args.device == 'cuda'
    if cuda and not torch.cuda.is_available():
        raise SystemExit('no CUDA device: run with --device cpu')
    print(f'device: {torch.cuda.get_device_name(0) if cuda else "cpu"}; '
          f'amp={not args.no_amp}')
    from mmsafe.datasets.synthetic_llvip import ensure_synthetic_llvip
    ensure_synthetic_llvip(args.data_dir, **synthetic(args))
    print(f'synthetic LLVIP tree {args.img_size[0]}x{args.img_size[1]}, '
          f'{args.train} train pairs; windows per arm: warmup {args.warmup}, '
          f'timed {args.timed}, split {args.split}, count {args.count}, '
          f'profile {args.profile if cuda else 0} iterations')
    runs = {arm: [] for arm in args.arms}
    for r in range(args.rounds):
        order = args.arms[r % len(args.arms):] + args.arms[:r % len(args.arms)]
        for arm in order:
            runs[arm].append(run_arm(arm, args, r))
    ok, baseline = True, {}
    for arm in args.arms:
        figures = report(arm, runs[arm], cuda, baseline)
        if arm == 'recipe':
            baseline = figures
        ok = ok and figures['ok']
    print('\nsummary, paired samples/s per arm: ' + '; '.join(
        f'{arm} {median([r["pairs_per_s"] for r in runs[arm]]):.2f}'
        for arm in args.arms))
    print(f'uptime after: {uptime()}')
    print(f'recipe profile: {"OK" if ok else "FAILED"}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())

"""Train a detector with mmsafe's components and guards available.

The command line follows MMDetection's ``tools/train.py``::

    python tools/train.py CONFIG [--work-dir DIR] [--resume [PATH]] [--amp]
        [--auto-scale-lr] [--cfg-options k=v ...] [--launcher pytorch]
        [--preflight [--ignore-preflight-errors]]

Multi-GPU / multi-process (works on CPU with gloo as well)::

    torchrun --nproc_per_node=2 tools/train.py CONFIG --launcher pytorch
"""
import argparse
import logging
import os

from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError

def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description='Train a detector (mmsafe)')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp', action='store_true', default=False,
        help='enable automatic mixed precision training (CPU or CUDA)')
    parser.add_argument(
        '--auto-scale-lr', action='store_true',
        help='scale the learning rate by the real total batch size')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from PATH; without PATH, resume from the newest '
        'loadable checkpoint in the work dir')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override settings in the config, key=value pairs')
    parser.add_argument(
        '--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none', help='job launcher')
    parser.add_argument(
        '--preflight', action='store_true',
        help='run the checks of tools/preflight.py first and refuse to start '
        'when one of them is an error')
    parser.add_argument(
        '--ignore-preflight-errors', action='store_true',
        help='with --preflight: print the errors but start anyway')
    parser.add_argument(
        '--debug', action='store_true',
        help='print the full traceback of an error that mmsafe raises on '
        'purpose (by default: its message only, the traceback in the log '
        'file; MMSAFE_DEBUG=1 does the same)')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def apply_amp(cfg) -> None:
    """Switch the optim wrapper to its AMP counterpart.

    ``NaNSkipOptimWrapper`` becomes ``AmpNaNSkipOptimWrapper``. A plain
    ``OptimWrapper`` becomes ``AmpOptimWrapper`` on CUDA; without CUDA,
    MMEngine's AmpOptimWrapper refuses to run, so mmsafe's
    ``AmpNaNSkipOptimWrapper`` (CPU autocast + GradScaler) is used instead.
    """
    import torch
    from mmengine.logging import print_log
    optim_wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if optim_wrapper in ('AmpOptimWrapper', 'AmpNaNSkipOptimWrapper'):
        print_log('AMP is already enabled in the config.', logger='current',
                  level=logging.WARNING)
        return
    if optim_wrapper == 'NaNSkipOptimWrapper' or not torch.cuda.is_available():
        if optim_wrapper not in ('OptimWrapper', 'NaNSkipOptimWrapper'):
            raise MMSafeValueError(
                f'--amp cannot convert optim_wrapper type {optim_wrapper!r}; '
                'set an AMP optim wrapper in the config instead.')
        if optim_wrapper == 'OptimWrapper':
            print_log('[mmsafe] --amp without CUDA: using '
                      'AmpNaNSkipOptimWrapper (CPU autocast + GradScaler).',
                      logger='current', level=logging.WARNING)
        cfg.optim_wrapper.type = 'AmpNaNSkipOptimWrapper'
    else:
        assert optim_wrapper == 'OptimWrapper', (
            '`--amp` is only supported when the optimizer wrapper type is '
            f'`OptimWrapper` or `NaNSkipOptimWrapper` but got {optim_wrapper}.')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')


def build_cfg(args):
    from mmsafe.tools_lib.cli import load_config
    cfg = load_config(args.config, args.launcher, args.cfg_options,
                      args.work_dir)
    if args.amp:
        apply_amp(cfg)
    if args.auto_scale_lr:
        if ('auto_scale_lr' in cfg and 'enable' in cfg.auto_scale_lr
                and 'base_batch_size' in cfg.auto_scale_lr):
            cfg.auto_scale_lr.enable = True
        else:
            raise MMSafeRuntimeError('Can not find "auto_scale_lr" or '
                                     '"auto_scale_lr.enable" or '
                                     '"auto_scale_lr.base_batch_size" in your'
                                     ' configuration file.')
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def main(argv=None):
    args = parse_args(argv)
    import mmsafe  # noqa: F401  (registers mmsafe's components)
    from mmsafe.errors import explained_errors

    # An error mmsafe raises on purpose: its message, not the library
    # tracebacks under it (those go to the log file; --debug prints them).
    with explained_errors(args.debug):
        return run(args)


def run(args):
    from mmdet.utils import setup_cache_size_limit_of_dynamo
    from mmsafe.engine.runner.stop import ends_soon_after_error
    from mmsafe.tools_lib.cli import (build_runner, explained_unknown_types,
                                      release_process_group)

    setup_cache_size_limit_of_dynamo()
    cfg = build_cfg(args)
    if args.preflight:
        from mmsafe.preflight import preflight_gate
        preflight_gate(cfg, args.launcher,
                       strict=not args.ignore_preflight_errors)
    from mmsafe.engine.runner import TrainingPreempted
    with explained_unknown_types():
        runner = build_runner(cfg)
        try:
            # Under DDP the other ranks wait for this one: after an error
            # it must be gone soon, even if its shutdown hangs.
            with ends_soon_after_error(runner):
                runner.train()
        except TrainingPreempted:
            # A stop signal ended the run after its checkpoint was saved:
            # a clean end, with the exit code of a preemption.
            release_process_group(runner)
            raise
    release_process_group(runner)
    return runner


def console_main() -> None:
    """The ``mmsafe-train`` command (its exit code: 0, or the error's)."""
    main()


if __name__ == '__main__':
    main()

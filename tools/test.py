"""Test (and evaluate) a detector with mmsafe's components available.

Follows MMDetection's ``tools/test.py``::

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE.pkl]
        [--show] [--show-dir DIR] [--cfg-options k=v ...] [--launcher pytorch]
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))


def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description='Test a detector (mmsafe)')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save the metrics')
    parser.add_argument('--out', type=str,
                        help='dump predictions to a pickle file (.pkl)')
    parser.add_argument('--show', action='store_true',
                        help='show prediction results in a window')
    parser.add_argument(
        '--show-dir', help='directory (inside the work dir) where painted '
        'images are saved')
    parser.add_argument('--wait-time', type=float, default=2,
                        help='the interval of show (s)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings in the config')
    parser.add_argument('--launcher',
                        choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def enable_visualization(cfg, args) -> None:
    """Turn on MMDetection's DetVisualizationHook for --show/--show-dir."""
    default_hooks = cfg.default_hooks
    if 'visualization' not in default_hooks:
        raise RuntimeError(
            '--show/--show-dir need a `visualization=dict(type='
            "'DetVisualizationHook')` entry in default_hooks.")
    default_hooks['visualization']['draw'] = True
    if args.show:
        default_hooks['visualization']['show'] = True
        default_hooks['visualization']['wait_time'] = args.wait_time
    if args.show_dir:
        default_hooks['visualization']['test_out_dir'] = args.show_dir


def release_process_group() -> None:
    """Destroy the default process group before the interpreter exits.

    MMEngine leaves it alive; when Python then tears down a live gloo group,
    or one rank closes its connections while a peer still uses them, gloo's
    threads can abort the process ("terminate called without an active
    exception") after a run that finished cleanly. The barrier makes every
    rank finish before any rank tears the group down.
    """
    import torch.distributed as torch_dist
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    import mmsafe  # noqa: F401  (registers components, applies shims)
    from mmdet.utils import setup_cache_size_limit_of_dynamo
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    setup_cache_size_limit_of_dynamo()
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        enable_visualization(cfg, args)

    if 'runner_type' not in cfg:
        runner = Runner.from_cfg(cfg)
    else:
        runner = RUNNERS.build(cfg)

    if args.out is not None:
        if not args.out.endswith(('.pkl', '.pickle')):
            raise ValueError('--out must end with .pkl or .pickle')
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(
            DumpDetResults(out_file_path=args.out))
    metrics = runner.test()
    # Only after a clean finish: a crash keeps the group for the handlers
    # (the safety report needs the rank) and exits non-zero anyway.
    release_process_group()
    return metrics


if __name__ == '__main__':
    main()

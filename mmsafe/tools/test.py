"""Test (and evaluate) a detector with mmsafe's components available.

Follows MMDetection's ``tools/test.py``::

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE.pkl]
        [--show] [--show-dir DIR] [--cfg-options k=v ...] [--launcher pytorch]
"""
import argparse
import os

from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError

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


def enable_visualization(cfg, args) -> None:
    """Turn on MMDetection's DetVisualizationHook for --show/--show-dir."""
    default_hooks = cfg.default_hooks
    if 'visualization' not in default_hooks:
        raise MMSafeRuntimeError(
            '--show/--show-dir need a `visualization=dict(type='
            "'DetVisualizationHook')` entry in default_hooks.")
    default_hooks['visualization']['draw'] = True
    if args.show:
        default_hooks['visualization']['show'] = True
        default_hooks['visualization']['wait_time'] = args.wait_time
    if args.show_dir:
        default_hooks['visualization']['test_out_dir'] = args.show_dir


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
                                      load_config, release_process_group)

    setup_cache_size_limit_of_dynamo()
    cfg = load_config(args.config, args.launcher, args.cfg_options,
                      args.work_dir)
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        enable_visualization(cfg, args)

    with explained_unknown_types():
        runner = build_runner(cfg)
        if args.out is not None:
            if not args.out.endswith(('.pkl', '.pickle')):
                raise MMSafeValueError('--out must end with .pkl or .pickle')
            from mmdet.evaluation import DumpDetResults
            runner.test_evaluator.metrics.append(
                DumpDetResults(out_file_path=args.out))
        with ends_soon_after_error(runner):
            metrics = runner.test()
    release_process_group(runner)
    return metrics


def console_main() -> None:
    """The ``mmsafe-test`` command (its exit code: 0, or the error's)."""
    main()


if __name__ == '__main__':
    main()

"""Check a training config in seconds, before a run that takes hours.

Resolves the config exactly as ``tools/train.py`` does (same options) and
runs mmsafe's static checks: registry names, data files and a sample of
image pairs, DataLoader arguments, batch size / accumulation, AMP, load_from
and resume files, work dir space, vis backends, distributed settings, mmsafe
guards and the console encoding. No forward pass, no full dataset pass.

Usage::

    python tools/preflight.py CONFIG [--cfg-options k=v ...]
        [--launcher pytorch] [--work-dir DIR] [--amp] [--resume [PATH]]
        [--json] [--samples N] [--full-index] [--skip CHECK ...]
        [--errors-only]

Exit status: 0 when no row is an error, 1 otherwise (2: bad arguments).
"""
import argparse
import os
import sys


def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='Check a training config before training (mmsafe)')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the work dir training would use')
    parser.add_argument('--amp', action='store_true', default=False,
                        help='check as if tools/train.py got --amp')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='check as if tools/train.py got --auto-scale-lr')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='check as if tools/train.py got --resume [PATH]')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings in the config, key=value')
    parser.add_argument('--launcher',
                        choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher of the run')
    parser.add_argument('--json', action='store_true',
                        help='print the report as JSON')
    parser.add_argument('--samples', type=int, default=4,
                        help='dataset items to open per dataset (default 4)')
    parser.add_argument('--full-index', action='store_true',
                        help='build whole dataset indexes as training does '
                        '(default: LLVIP/VOC index the sampled images only)')
    parser.add_argument('--skip', nargs='+', default=[], metavar='CHECK',
                        help='checks to leave out, e.g. data checkpoint')
    parser.add_argument('--errors-only', action='store_true',
                        help='show warn and error rows only')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = sys.stdout
    if args.json:
        # Log lines (MMEngine's logger binds to the sys.stdout of the moment
        # it is created) go to stderr, so stdout carries the JSON only.
        sys.stdout = sys.stderr
    try:
        report = _run(args)
    finally:
        sys.stdout = out
    report.print(out, as_json=args.json, show_ok=not args.errors_only)
    return 1 if report.has_errors else 0


def _run(args):
    from mmsafe.preflight import CheckRow, PreflightReport, run_preflight
    try:
        import mmsafe  # noqa: F401  (registers components, as train.py)
        from mmsafe.tools.train import build_cfg
        cfg = build_cfg(args)
    except Exception as err:  # the config itself does not resolve
        report = PreflightReport(config=args.config, launcher=args.launcher)
        report.add(CheckRow(
            'error', 'config', f'The config does not load: '
            f'{type(err).__name__}: {" ".join(str(err).split())[:600]}',
            args.config, 'Fix the file (syntax, _base_ paths, '
            'custom_imports) or the --cfg-options.'))
    else:
        report = run_preflight(cfg, args.launcher, samples=args.samples,
                               skip=args.skip, full_index=args.full_index)
        report.config = args.config
    return report


def console_main() -> int:
    """The ``mmsafe-preflight`` command."""
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    return main()


if __name__ == '__main__':
    sys.exit(console_main())

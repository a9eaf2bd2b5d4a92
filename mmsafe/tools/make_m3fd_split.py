"""Write a deterministic M3FD split (the release has none)::

    python tools/make_m3fd_split.py DATA_ROOT [--ratios 0.8 0.1 0.1]
        [--seed 0] [--block N] [--out-dir ImageSets] [--force]
    python tools/make_m3fd_split.py DATA_ROOT --scenario scenario.json

``DATA_ROOT`` is the ``M3FD_Detection`` folder (``Vis/``, ``Ir/``,
``Annotation/``). Writes ``ImageSets/train.txt``, ``val.txt`` (and
``test.txt`` with three ratios), one stem per line, sorted: the lists
``configs/_base_/datasets/m3fd.py`` reads. The default, 8:1:1 with seed 0,
gives 3,360 / 420 / 420 of the 4,200 frames, the same lists on every
machine (:mod:`mmsafe.tools_lib.m3fd_split`). ``--block 20`` keeps each run
of 20 consecutive frame numbers on one side; ``--scenario`` reproduces
TarDAL's train / val lists from its ``scenario.json``.
"""
import argparse
import sys

def parse_args(argv=None):
    from mmsafe.tools_lib.m3fd_split import DEFAULT_RATIOS
    parser = argparse.ArgumentParser(
        description='Write a deterministic M3FD train/val/test split')
    parser.add_argument('data_root', help='the M3FD_Detection folder')
    parser.add_argument('--ratios', type=float, nargs='+',
                        default=list(DEFAULT_RATIOS),
                        help='train val [test] shares (default 0.8 0.1 0.1)')
    parser.add_argument('--seed', type=int, default=0,
                        help='changes the lists (default 0)')
    parser.add_argument('--block', type=int, default=1,
                        help='keep runs of N consecutive frame numbers '
                        'together (default 1: frame by frame)')
    parser.add_argument('--scenario', metavar='JSON',
                        help="TarDAL's scenario.json: its train/val lists "
                        'instead of ratios')
    parser.add_argument('--out-dir', default='ImageSets',
                        help='folder under DATA_ROOT (default ImageSets)')
    parser.add_argument('--force', action='store_true',
                        help='replace existing lists with other frames')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmsafe.tools_lib.m3fd_split import make_split
    try:
        paths = make_split(args.data_root, args.ratios, args.seed,
                           args.block, args.scenario, args.out_dir,
                           args.force)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f'make_m3fd_split: {exc}', file=sys.stderr)
        return 1
    for name, path in paths.items():
        with open(path, encoding='utf-8') as f:
            count = sum(1 for line in f if line.strip())
        print(f'{name}: {count} frames -> {path}')
    return 0


def console_main() -> int:
    """The ``mmsafe-make-m3fd-split`` command."""
    return main()


if __name__ == '__main__':
    sys.exit(console_main())

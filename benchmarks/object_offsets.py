"""Boxes per second of the per-box visible/infrared offset measure
(``mmsafe/tools_lib/object_offsets.py``) on one core.

Synthetic LLVIP-like pairs (the generator's people, 100-500 px tall at
1280x1024 by default), decoded images (decoding is not counted), OpenCV
on one thread; each box is measured both ways (visible box in the
infrared window and back)::

    python benchmarks/object_offsets.py
    python benchmarks/object_offsets.py --size 640 512 --pairs 100
"""
import argparse
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks._common import machine, revision, uptime  # noqa: E402
from mmsafe.tools_lib.object_offsets import benchmark  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--size', type=int, nargs=2, default=(1280, 1024),
                        metavar=('W', 'H'), help='image size')
    parser.add_argument('--pairs', type=int, default=50,
                        help='pairs measured (4 distinct scenes in turn)')
    args = parser.parse_args(argv)
    print(f'uptime before: {uptime()}')
    print(f'machine: {machine()}; revision {revision()}')
    result = benchmark(tuple(args.size), args.pairs)
    print(f"object offsets, {args.size[0]}x{args.size[1]}, {result['pairs']} "
          f"pairs, {result['boxes']} boxes ({result['confident']} "
          f"measured confidently): {result['ms_per_box']} ms per box, "
          f"{result['boxes_per_second']} boxes/s on one core")
    print(f'uptime after: {uptime()}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

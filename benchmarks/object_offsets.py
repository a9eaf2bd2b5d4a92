"""Boxes per second of the per-box visible/infrared check
(``mmsafe/analysis/object_offsets.py``) on one core, or its verdicts on a
real tree.

Synthetic LLVIP-like pairs (the generator's people, 100-500 px tall at
1280x1024 by default), decoded images (decoding is not counted), OpenCV
on one thread::

    python benchmarks/object_offsets.py
    python benchmarks/object_offsets.py --size 640 512 --pairs 100

With ``--llvip-root`` it measures a tree in LLVIP's layout (``Annotations/
*.xml``, ``visible/SPLIT``, ``infrared/SPLIT``) twice: every annotated
pair as it is, and every pair with the infrared file of the next file
number (a folder one file late: the same fixed-camera scene a moment
later). It prints the share of boxes with a verdict, the verdicts, the
pairs flagged and the milliseconds per pair (decoding not counted).
``--scale`` resizes both images first (0.5: KAIST's 640x512 from LLVIP's
1280x1024) and ``--ir-shift DX DY`` moves the infrared image by a few
pixels (a weakly aligned dataset); offsets are then judged at that size::

    python benchmarks/object_offsets.py --llvip-root data/LLVIP
    python benchmarks/object_offsets.py --llvip-root data/LLVIP \\
        --scale 0.5 --ir-shift 3 2
"""
import argparse
import glob
import os.path as osp
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks._common import machine, revision, uptime  # noqa: E402
from mmsafe.analysis.object_offsets import (VERDICTS,  # noqa: E402
                                            benchmark, pair_offsets)


def _boxes(xml_path: str):
    """The VOC boxes of one LLVIP file, 0-based (LLVIP's xml is 1-based)."""
    boxes = []
    for obj in ET.parse(xml_path).getroot().findall('object'):
        b = obj.find('bndbox')
        x1, y1, x2, y2 = (float(b.find(k).text)
                          for k in ('xmin', 'ymin', 'xmax', 'ymax'))
        boxes.append([x1 - 1, y1 - 1, x2 - 1, y2 - 1])
    return boxes


def _read(path: str, scale: float, shift=(0.0, 0.0)):
    import cv2
    import numpy as np
    img = cv2.imread(path, cv2.IMREAD_COLOR)
    if img is None:
        raise OSError(f'cannot read {path}')
    if scale != 1.0:
        img = cv2.resize(img, None, fx=scale, fy=scale,
                         interpolation=cv2.INTER_AREA)
    if shift != (0.0, 0.0):
        m = np.float32([[1, 0, shift[0]], [0, 1, shift[1]]])
        img = cv2.warpAffine(img, m, (img.shape[1], img.shape[0]),
                             borderMode=cv2.BORDER_REFLECT)
    return img


def real_pairs(root: str, split: str, limit: int = 0):
    """``(stem, visible, infrared, next infrared or None, xml)`` paths of
    the annotated pairs of ``split``, in file order."""
    found = []
    for xml in sorted(glob.glob(osp.join(root, 'Annotations', '*.xml'))):
        stem = osp.splitext(osp.basename(xml))[0]
        vis = osp.join(root, 'visible', split, f'{stem}.jpg')
        ir = osp.join(root, 'infrared', split, f'{stem}.jpg')
        if not (osp.isfile(vis) and osp.isfile(ir)):
            continue
        nxt = None
        if stem.isdigit():
            nxt = osp.join(root, 'infrared', split,
                           f'{int(stem) + 1:0{len(stem)}d}.jpg')
            nxt = nxt if osp.isfile(nxt) else None
        found.append((stem, vis, ir, nxt, xml))
        if limit and len(found) >= limit:
            break
    return found


def measure_tree(root: str, split: str = 'train', limit: int = 0,
                 scale: float = 1.0, ir_shift=(0.0, 0.0),
                 max_offset: float = 8.0):
    """Verdicts of the annotated pairs as paired and one file late."""
    import cv2
    cv2.setNumThreads(1)
    found = real_pairs(root, split, limit)
    if not found:
        raise FileNotFoundError(
            f'no annotated pair under {root} (Annotations/*.xml with '
            f'visible/{split}/STEM.jpg and infrared/{split}/STEM.jpg)')
    out = {}
    for kind in ('as paired', 'infrared one file late'):
        counts, boxes, verdicts, flagged, pairs, seconds = (Counter(), 0, 0,
                                                            0, 0, 0.0)
        for stem, vis_path, ir_path, next_ir, xml in found:
            partner = ir_path if kind == 'as paired' else next_ir
            if partner is None:
                continue
            b = [[v * scale for v in box] for box in _boxes(xml)]
            if not b:
                continue
            vis = _read(vis_path, scale)
            ir = _read(partner, scale, tuple(ir_shift))
            start = time.perf_counter()
            result = pair_offsets(vis, ir, b, max_offset=max_offset)
            seconds += time.perf_counter() - start
            pairs += 1
            boxes += len(b)
            verdicts += result['verdicts']
            flagged += bool(result['flagged'])
            counts.update(r['verdict'] for r in result['boxes'])
        out[kind] = dict(pairs=pairs, boxes=boxes, verdicts=verdicts,
                         flagged=flagged, counts=counts,
                         ms_per_pair=1000 * seconds / max(1, pairs))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--size', type=int, nargs=2, default=(1280, 1024),
                        metavar=('W', 'H'), help='image size')
    parser.add_argument('--pairs', type=int, default=50,
                        help='pairs measured (4 distinct scenes in turn)')
    parser.add_argument('--llvip-root', metavar='DIR',
                        help='measure the verdicts on a real tree in '
                        "LLVIP's layout instead")
    parser.add_argument('--split', default='train',
                        help='the split folder of --llvip-root')
    parser.add_argument('--limit', type=int, default=0,
                        help='at most this many annotated pairs (0: all)')
    parser.add_argument('--scale', type=float, default=1.0,
                        help='resize both images of --llvip-root first')
    parser.add_argument('--ir-shift', type=float, nargs=2, default=(0, 0),
                        metavar=('DX', 'DY'),
                        help='move the infrared images by these pixels')
    parser.add_argument('--max-offset', type=float, default=8.0,
                        help='pixels (of the measured size) beyond which a '
                        'matched box disagrees')
    args = parser.parse_args(argv)
    print(f'uptime before: {uptime()}')
    print(f'machine: {machine()}; revision {revision()}')
    if args.llvip_root:
        result = measure_tree(args.llvip_root, args.split, args.limit,
                              args.scale, tuple(args.ir_shift),
                              args.max_offset)
        print(f'per-box check on {args.llvip_root} (split {args.split}, '
              f'scale {args.scale:g}, infrared shifted by '
              f'({args.ir_shift[0]:g}, {args.ir_shift[1]:g}) px, '
              f'max offset {args.max_offset:g} px):')
        for kind, r in result.items():
            share = 100.0 * r['verdicts'] / max(1, r['boxes'])
            verdicts = ', '.join(f'{v} {r["counts"][v]}' for v in VERDICTS)
            print(f"  {kind}: {r['pairs']} pairs, {r['verdicts']} of "
                  f"{r['boxes']} boxes with a verdict ({share:.1f}%; "
                  f"{verdicts}); {r['flagged']} of {r['pairs']} pairs "
                  f"flagged; {r['ms_per_pair']:.1f} ms per pair")
    else:
        result = benchmark(tuple(args.size), args.pairs)
        print(f"object offsets, {args.size[0]}x{args.size[1]}, "
              f"{result['pairs']} pairs, {result['boxes']} boxes "
              f"({result['verdicts']} with a verdict, "
              f"{result['confident']} matched): {result['ms_per_box']} ms "
              f"per box, {result['boxes_per_second']} boxes/s on one core")
    print(f'uptime after: {uptime()}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

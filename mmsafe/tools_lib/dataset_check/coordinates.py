"""Whether a dataset reads its boxes with the right coordinate base, from
where the boxes of a whole split meet the image borders.

Objects cut by the image border are annotated up to the border, and there
are many of them in driving and surveillance data. Read with the right
base, those boxes start at exactly 0 and end at the last pixel (``width -
1``, the PASCAL VOC convention MMDetection keeps) or at the border itself
(``width``, corner coordinates). Each sample's record counts its boxes at
those values (:func:`border_contacts`, each image with its own size); the
split's totals (:func:`base_shift`) give the verdict:

* a spike of boxes starting at exactly -1 while the boxes at the far
  borders end at ``width - 2`` or ``width - 1``: one is subtracted too
  many (a 0-based release read as 1-based);
* a spike of boxes ending at exactly ``width + 1`` while the near borders
  are met at 1: one too few.

A spike needs :data:`MIN_CONTACTS` coordinates and at least :data:`SHARE`
of the count at the healthy value(s): read with the right base, a box
past the border is an annotation slip (at most 39 of 110,447 boxes on the
real releases below), not a quarter of the border contacts. Boxes
starting at 1 and ending at ``width`` give no verdict: PASCAL VOC's
1-based files read as 0-based look like that, and so do labelImg's files
read correctly (0-based, with a minimum below 1 raised to 1). On real
releases, each read with the base its dataset uses: aligned FLIR (5,141 frames, 40,765 boxes), M3FD
(4,200, 34,407), LLVIP (100, 439) and KAIST's ``annotations-xml-new``
(45,471 frames with boxes, 110,447 boxes, as ``x, y, x + w, y + h``) give
no verdict; aligned FLIR read 1-based and KAIST's xml read minus one give
"one too many" (1,363 coordinates at -1 against 302 at 0; 956 against
188), KAIST's xml read plus one "one too few" (1,259 at width + 1 against
1,454 at the border); M3FD and LLVIP read with the other base start at 1
and end at the width: no verdict, as explained above.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np

#: x1/y1 values counted (the healthy one is 0)
LOW_VALUES = (-1, 0, 1)
#: x2 - width / y2 - height values counted (healthy: -1 or 0)
HIGH_VALUES = (-2, -1, 0, 1)
#: boxes a spike needs before it is a verdict
MIN_CONTACTS = 10
#: the share of the healthy value's count a spike must reach
SHARE = 0.25
_EPS = 1e-3


def border_contacts(boxes: np.ndarray, width: float,
                    height: float) -> Dict[str, List[int]]:
    """How many coordinates of ``boxes`` (xyxy, as loaded) sit at each of
    :data:`LOW_VALUES` (x1, y1) and :data:`HIGH_VALUES` (x2 - width,
    y2 - height)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    low = np.concatenate([boxes[:, 0], boxes[:, 1]])
    high = np.concatenate([boxes[:, 2] - width, boxes[:, 3] - height])
    return dict(
        low=[int(np.sum(np.abs(low - v) < _EPS)) for v in LOW_VALUES],
        high=[int(np.sum(np.abs(high - v) < _EPS)) for v in HIGH_VALUES])


def _spike(counts: Dict[int, int], value: int, healthy: Sequence[int]) -> \
        bool:
    return counts[value] >= MIN_CONTACTS and \
        counts[value] >= SHARE * max(counts[h] for h in healthy)


def _peak(counts: Dict[int, int]) -> Optional[int]:
    if sum(counts.values()) < MIN_CONTACTS:
        return None
    return max(counts, key=lambda v: counts[v])


def base_shift(low: Sequence[int], high: Sequence[int]) -> int:
    """-1 (one subtracted too many), +1 (one too few) or 0 (no verdict),
    from the split's :func:`border_contacts` totals."""
    lows = dict(zip(LOW_VALUES, low))
    highs = dict(zip(HIGH_VALUES, high))
    if _spike(lows, -1, (0, )) and _peak(highs) in (None, -2, -1):
        return -1
    if _spike(highs, 1, (-1, 0)) and _peak(lows) in (None, 1):
        return 1
    return 0


def _leaf_base(dataset) -> Optional[int]:
    base = getattr(dataset, 'bbox_base', None)
    return base if isinstance(base, int) else None


def _fix(dataset, shift: int) -> str:
    name = type(dataset).__name__
    base = _leaf_base(dataset)
    if base is not None and base + shift in (0, 1):
        return (f'set bbox_base={base + shift} on {name} (it reads them '
                f'with bbox_base={base})')
    if shift < 0:
        return (f'{name} subtracts 1 too many from the annotated '
                'coordinates: read them as they are (0-based)')
    return (f'{name} subtracts 1 too few from the annotated coordinates: '
            'subtract 1 (1-based files, as PASCAL VOC)')


def coordinate_findings(records: Sequence[dict], leaves: Sequence,
                        issue) -> tuple:
    """The split's border totals per leaf dataset and the findings.

    Args:
        records (Sequence[dict]): the audit records (``border``, ``leaf``,
            ``ann_path``, ``img_path``).
        leaves (Sequence): the leaf datasets, indexed by ``record['leaf']``.
        issue (callable): :func:`~.checks.issue`.

    Returns:
        tuple: ``(summary, findings)``: one summary dict per leaf with
        border contacts, and a ``coordinate_base`` finding per leaf whose
        boxes say its base is off by one.
    """
    summary, findings = [], []
    for leaf_index, leaf in enumerate(leaves):
        mine = [r for r in records
                if r.get('leaf') == leaf_index and r.get('border')]
        if not mine:
            continue
        low = np.sum([r['border']['low'] for r in mine], axis=0).tolist()
        high = np.sum([r['border']['high'] for r in mine], axis=0).tolist()
        boxes = int(sum(r.get('raw_boxes', 0) for r in mine))
        shift = base_shift(low, high)
        summary.append(dict(
            dataset=type(leaf).__name__, bbox_base=_leaf_base(leaf),
            boxes=boxes,
            low={str(v): c for v, c in zip(LOW_VALUES, low)},
            high={str(v): c for v, c in zip(HIGH_VALUES, high)},
            shift=shift))
        if not shift:
            continue
        at = 0 if shift < 0 else len(HIGH_VALUES) - 1
        side = 'low' if shift < 0 else 'high'
        files = [r.get('ann_path') or r.get('img_path') for r in mine
                 if r['border'][side][at] > 0]
        if shift < 0:
            what = (f'{low[0]} box coordinates start at x or y = -1 and '
                    f'{low[1]} at 0; at the far borders {high[0]} end at '
                    f'width/height - 2 and {high[1]} at - 1')
        else:
            what = (f'{high[-1]} box coordinates end at width/height + 1 '
                    f'and {high[-2]} at the border; at the near borders '
                    f'{low[2]} start at 1 and {low[1]} at 0')
        shown = ', '.join(str(f) for f in files[:3])
        more = f' (+{len(files) - 3} more)' if len(files) > 3 else ''
        way = 'left/up' if shift < 0 else 'right/down'
        findings.append(dict(
            index=None, img_path=None, ir_img_path=None,
            **issue('coordinate_base',
                    f'{type(leaf).__name__}: {what} ({boxes} boxes): the '
                    f'boxes are 1 px {way} of their objects: '
                    f'{_fix(leaf, shift)}. Files: {shown}{more}', 'dataset',
                    files=files, shift=shift)))
    return summary, findings


def format_borders(summary: Sequence[dict]) -> List[str]:
    """One report line per leaf dataset."""
    lines = []
    for s in summary:
        base = '' if s['bbox_base'] is None else \
            f", bbox_base={s['bbox_base']}"
        verdict = {0: 'no verdict', -1: 'one subtracted too many',
                   1: 'one subtracted too few'}[s['shift']]
        lines.append(
            f"box borders ({s['dataset']}{base}, {s['boxes']} boxes): "
            'x1/y1 at -1/0/1: ' + '/'.join(
                str(s['low'][str(v)]) for v in LOW_VALUES) +
            '; x2/y2 at size-2/-1/+0/+1: ' + '/'.join(
                str(s['high'][str(v)]) for v in HIGH_VALUES) +
            f'; coordinate base: {verdict}')
    return lines

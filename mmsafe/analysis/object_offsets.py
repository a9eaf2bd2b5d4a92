"""Per-box visible/infrared check: is each annotated person where the box
says, in both modalities?

:mod:`.pair_alignment` compares whole images. An infrared file taken a
moment earlier or later in the same fixed-camera scene passes it (the
background matches), while the people are elsewhere than the boxes; and a
weakly aligned dataset (visible and infrared people offset by several
pixels, as in KAIST) passes it too. Here each box gets a verdict of its
own, from two measures:

* **matching** (:mod:`.box_matching`): the visible box's gradient map
  found in the infrared image, and back; it gives the offset ``(dx, dy)``:
  where
  the box's content sits in the infrared image minus where it sits in the
  visible one, in pixels of the original image (the pipeline's
  ``scale_factor`` and horizontal flip undone);
* **presence** (:mod:`.box_presence`): what the infrared image shows in
  the box against a ring around it: a warm body, an outline, or ground
  like its surroundings. At night the visible crop is dark and has little
  to match, while the infrared one shows the person.

A match counts only where the infrared image shows a body (a match of
background edges, the same in both images of a fixed camera, would read
0 px while the person is gone), and only near the box when the box itself
holds one (a chance match far away does not move a person the infrared
image shows in place); a match of correlation ``strong_corr`` (0.9) or
more counts wherever it lands (the box's own content is in both). The
verdicts (:data:`VERDICTS`):

========== ===================================== =========================
verdict    meaning                               agrees with the box when
========== ===================================== =========================
matched    content found at ``(dx, dy)``         ``|d| <= max_offset``
warm       a body warmer than its surroundings   always
outline    a body's outline, not warmer          always
empty      nothing here: ground like the ring    never
none       no verdict (``reason``: small, border, flat, unclear)
========== ===================================== =========================

A pair is flagged ``pair_objects_offset`` when more of its boxes
disagree than agree: a few cold or hidden people do not flag a pair of
many, an infrared folder of other moments (most boxes on empty ground, or
people moved) does. On real LLVIP night pairs nearly every box gets a
verdict (see the user guide for the figures).

Used by ``tools/check_dataset.py`` (every pair, as its pipeline outputs
it; a distribution per dataset and per folder) and ``FirstBatchStatsHook``
(the first pairs).
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mmsafe.errors import MMSafeValueError
from .box_matching import box_match
from . import box_presence
from .box_presence import PRESENT, infrared_presence
# the pictures are used through this module (tools/check_dataset.py)
from .offset_pictures import (draw_offsets, histogram_image,  # noqa: F401
                              write_histogram)
from .pair_alignment import hwc_view

FINDING = 'pair_objects_offset'
MATCHED, WARM, OUTLINE, EMPTY, NONE = ('matched', 'warm', 'outline',
                                       'empty', 'none')
VERDICTS = (MATCHED, WARM, OUTLINE, EMPTY, NONE)
_MEANING = {WARM: 'warm here', OUTLINE: 'outline here',
            EMPTY: 'nothing here'}
# the infrared presence states that are a verdict on their own
_FROM_PRESENCE = {box_presence.WARM: WARM, box_presence.OUTLINE: OUTLINE,
                  box_presence.EMPTY: EMPTY}


def _boxes(boxes) -> np.ndarray:
    if boxes is None:
        return np.zeros((0, 4), np.float32)
    if hasattr(boxes, 'tensor'):  # mmdet BaseBoxes
        boxes = boxes.tensor
    if hasattr(boxes, 'detach'):
        boxes = boxes.detach().cpu().numpy()
    return np.asarray(boxes, dtype=np.float32).reshape(-1, 4)


def _split(kwargs: Dict) -> Tuple[Dict, Dict]:
    """``pair_offsets``'s keyword arguments for :func:`box_match` and for
    :func:`infrared_presence` (``presence_`` prefixed); ``min_box`` goes
    to both."""
    match, presence = {}, {}
    for key, value in kwargs.items():
        if key.startswith('presence_'):
            presence[key[len('presence_'):]] = value
        else:
            match[key] = value
            if key == 'min_box':
                presence[key] = value
    return match, presence


def box_verdict(visible: np.ndarray, infrared: np.ndarray,
                box: Sequence[float], strong_corr: float = 0.9,
                **kwargs) -> Dict:
    """The verdict of one box (pixels of the images given).

    Args:
        visible, infrared: ``H x W (x C)`` arrays (``hwc_view``), same
            size.
        box: ``(x1, y1, x2, y2)``.
        strong_corr (float): a match at least this strong counts wherever
            it lands (on real LLVIP night pairs, matches of the background
            alone reached 0.80 with the people gone).
        **kwargs: :func:`mmsafe.analysis.box_matching.box_match`'s
            arguments, and :func:`mmsafe.analysis.box_presence.
            infrared_presence`'s with a ``presence_`` prefix.

    Returns:
        dict: ``verdict`` (one of :data:`VERDICTS`), ``dx``, ``dy`` (None
        unless matched), ``corr``, ``corr_zero``, ``template`` (the
        match's), ``contrast``, ``texture``, ``presence`` (the infrared
        presence state in the box), ``reason`` (why no verdict, or why no
        match counted).
    """
    match_kw, presence_kw = _split(kwargs)
    x1, y1, x2, y2 = (float(v) for v in box)
    here = infrared_presence(infrared, (x1, y1, x2, y2), **presence_kw)
    match = box_match(visible, infrared, (x1, y1, x2, y2), **match_kw)
    out = dict(verdict=NONE, dx=None, dy=None, corr=match['corr'],
               corr_zero=match['corr_zero'], template=match['template'],
               contrast=here['contrast'], texture=here['texture'],
               presence=here['state'], reason=None)
    measured = here['contrast'] is not None
    if match['confident']:
        dx, dy = match['dx'], match['dy']
        there = here
        if measured and np.hypot(dx, dy) > 1.0:
            there = infrared_presence(infrared, (x1 + dx, y1 + dy, x2 + dx,
                                                 y2 + dy), **presence_kw)
        near = np.hypot(dx, dy) <= 0.5 * min(x2 - x1, y2 - y1)
        if not measured or there['contrast'] is None:
            accepted = True  # nothing to check it against (image border)
        elif match['corr'] >= strong_corr:
            # the box's own content, not only its surroundings, is the same
            # in both images (a background match with the person gone
            # stays below: the visible crop holds a person the infrared
            # one lacks)
            accepted = True
        else:
            accepted = there['state'] in PRESENT and (
                near or here['state'] not in PRESENT)
        if accepted:
            out.update(verdict=MATCHED, dx=dx, dy=dy)
            return out
        out['reason'] = ('match on no body' if there['state'] not in PRESENT
                         else 'match away from the body in the box')
    if here['state'] in _FROM_PRESENCE:
        out['verdict'] = _FROM_PRESENCE[here['state']]
    else:
        out['reason'] = here['state']
    return out


def _to_original(dx: float, dy: float, scale_factor=None,
                 flip_direction: Optional[str] = None) -> Tuple[float, float]:
    """Pipeline pixels to original ones: undo a rescale and a flip."""
    if flip_direction in ('horizontal', 'diagonal'):
        dx = -dx
    if flip_direction in ('vertical', 'diagonal'):
        dy = -dy
    if scale_factor is not None:
        sf = np.asarray(scale_factor, dtype=np.float64).reshape(-1)
        if sf.size >= 2 and sf[0] > 0 and sf[1] > 0:
            dx, dy = dx / sf[0], dy / sf[1]
        elif sf.size == 1 and sf[0] > 0:
            dx, dy = dx / sf[0], dy / sf[0]
    return dx, dy


def _one(value: float) -> str:
    """One decimal, without a minus sign on a value that rounds to 0."""
    return f'{round(value, 1) + 0.0:.1f}'


def _label(row: Dict) -> Tuple[str, str]:
    """The short label drawn on the box and the words of the verdict."""
    verdict = row['verdict']
    if verdict == MATCHED:
        return (f"match {row['d']:.0f}px",
                f"matched ({row['dx']:+.1f}, {row['dy']:+.1f})")
    if verdict == WARM:
        return f"warm {_one(row['contrast'])}", _MEANING[WARM]
    if verdict == OUTLINE:
        return f"outline {_one(row['texture'])}", _MEANING[OUTLINE]
    if verdict == EMPTY:
        return f"empty {_one(row['contrast'])}", _MEANING[EMPTY]
    return f"? {row['reason']}", f"no verdict: {row['reason']}"


def pair_offsets(visible,
                 infrared,
                 boxes,
                 scale_factor=None,
                 flip_direction: Optional[str] = None,
                 max_offset: float = 8.0,
                 **kwargs) -> Dict:
    """Per-box verdicts of one pair and the pair's.

    Args:
        visible, infrared: the two images (``H x W x C`` arrays or
            ``[C, H, W]`` tensors, grey levels 0-255), same size.
        boxes: ``(N, 4)`` boxes in their pixels.
        scale_factor: ``(w_scale, h_scale)`` from the original image to
            these (the pipeline's ``scale_factor``); None: 1.
        flip_direction (str, optional): the pipeline's flip of both.
        max_offset (float): a matched box further off than this (original
            pixels) disagrees with its content.
        **kwargs: see :func:`box_verdict`.

    Returns:
        dict: ``boxes`` (per box: ``box`` as given, ``verdict``, ``label``
        (short, drawn), ``text`` (the verdict in words), ``disagrees``
        (None without a verdict), ``dx``, ``dy``, ``d`` in original pixels
        or None, ``confident`` (matched), ``corr``, ``corr_zero``,
        ``template``, ``contrast``, ``texture``, ``presence``,
        ``reason``), ``confident`` (matched boxes), ``verdicts`` (boxes
        with a verdict), ``agree``, ``disagree``, ``median_d`` (of the
        matched boxes; None without one), ``flagged``, ``max_offset``.
    """
    vis, ir = hwc_view(visible), hwc_view(infrared)
    if vis.shape[:2] != ir.shape[:2]:
        raise MMSafeValueError(
            f'pair_offsets: visible {vis.shape} and infrared '
            f'{ir.shape} differ in size')
    rows = []
    for box in _boxes(boxes):
        r = box_verdict(vis, ir, box, **kwargs)
        row = dict(box=[round(float(v), 1) for v in box], d=None,
                   confident=r['verdict'] == MATCHED, disagrees=None, **r)
        if row['confident']:
            dx, dy = _to_original(r['dx'], r['dy'], scale_factor,
                                  flip_direction)
            row.update(dx=round(dx, 2), dy=round(dy, 2),
                       d=round(float(np.hypot(dx, dy)), 2))
            row['disagrees'] = row['d'] > max_offset
        elif r['verdict'] != NONE:
            row['disagrees'] = r['verdict'] == EMPTY
        row['label'], row['text'] = _label(row)
        rows.append(row)
    ds = [r['d'] for r in rows if r['confident']]
    median = float(np.median(ds)) if ds else None
    disagree = sum(r['disagrees'] is True for r in rows)
    agree = sum(r['disagrees'] is False for r in rows)
    return dict(boxes=rows, confident=len(ds), verdicts=agree + disagree,
                agree=agree, disagree=disagree,
                median_d=None if median is None else round(median, 2),
                flagged=disagree > agree, max_offset=float(max_offset))


def offsets_message(result: Dict) -> str:
    """What a user reads for a flagged pair."""
    rows = result['boxes']
    empty = sum(r['verdict'] == EMPTY for r in rows)
    far = [r for r in rows if r['confident'] and r['disagrees']]
    parts = []

    def boxes(n: int) -> str:
        return f'{n} box' if n == 1 else f'{n} boxes'
    if empty:
        parts.append(f'{boxes(empty)} with nothing in the infrared image '
                     'where the box is (ground like its surroundings)')
    if far:
        shown = ', '.join(f'({r["dx"]:+.1f}, {r["dy"]:+.1f})' for r in far)
        parts.append(f'{boxes(len(far))} matched further off than '
                     f'{result["max_offset"]:g} px (offsets (dx, dy) in '
                     f'original pixels: {shown}; median |d| of the matched '
                     f'boxes {result["median_d"]:.1f} px)')
    return (f'the people in the boxes are not where the infrared image '
            f'shows them: of {result["verdicts"]} boxes with a verdict, '
            f'{result["disagree"]} disagree and {result["agree"]} agree; '
            + '; '.join(parts) + '. The partner is from another moment, '
            'or the modalities are not registered (re-annotate per '
            'modality or register them)')


def _sample_geometry(sample) -> Tuple[object, Optional[str]]:
    meta = getattr(sample, 'metainfo', None) or {}
    flip = meta.get('flip_direction') if meta.get('flip') else None
    return meta.get('scale_factor'), flip


def audit_offsets(modalities: Optional[Dict], sample,
                  max_offset: float = 8.0
                  ) -> Tuple[Optional[Dict], List[Tuple[str, str]]]:
    """Measure one pipeline output for ``tools/check_dataset.py``.

    Args:
        modalities (dict | None): ``{'visible': x, 'infrared': y}``.
        sample: its data sample (``gt_instances.bboxes`` and metainfo).
        max_offset (float): see :func:`pair_offsets`.

    Returns:
        tuple: the :func:`pair_offsets` result (None when the sample is
        not a same-size pair with boxes) and ``[(finding kind, message)]``.
    """
    if not modalities or 'visible' not in modalities or \
            'infrared' not in modalities:
        return None, []
    vis, ir = modalities['visible'], modalities['infrared']
    if tuple(vis.shape[-2:]) != tuple(ir.shape[-2:]):
        return None, []
    gt = getattr(sample, 'gt_instances', None)
    boxes = _boxes(getattr(gt, 'bboxes', None))
    if not len(boxes):
        return None, []
    scale_factor, flip = _sample_geometry(sample)
    result = pair_offsets(vis, ir, boxes, scale_factor, flip, max_offset)
    if not result['flagged']:
        return result, []
    return result, [(FINDING, offsets_message(result) + '; see --show-dir')]


def folder_of(path: Optional[str]) -> str:
    """The folder a pair is summarised under: the visible file's parent
    directory (a KAIST set/sequence, an LLVIP split)."""
    return osp.dirname(path) if path else '?'


def _stats(ds: Sequence[float]) -> Dict:
    if not len(ds):
        return dict(median=None, p95=None, max=None)
    arr = np.asarray(ds, dtype=np.float64)
    return dict(median=round(float(np.median(arr)), 2),
                p95=round(float(np.percentile(arr, 95)), 2),
                max=round(float(arr.max()), 2))


def _tally(results: Sequence[Dict]) -> Dict:
    """Counts and ``|d|`` statistics of :func:`pair_offsets` results."""
    rows = [b for r in results for b in r['boxes']]
    ds = [b['d'] for b in rows if b['confident']]
    by_verdict = {v: sum(b.get('verdict') == v for b in rows)
                  for v in VERDICTS}
    out = dict(boxes=len(rows), confident=len(ds),
               verdicts=sum(b.get('disagrees') is not None for b in rows),
               disagree=sum(b.get('disagrees') is True for b in rows),
               by_verdict=by_verdict, pairs=len(results),
               flagged_pairs=sum(bool(r['flagged']) for r in results))
    out.update(_stats(ds))
    out['d'] = [round(float(v), 2) for v in ds]
    return out


def offsets_summary(records: Sequence[Dict], key: str = 'offsets') -> Dict:
    """The verdicts and the distribution of ``|d|`` of an audit.

    Args:
        records (Sequence[dict]): audit records with ``img_path`` and a
            :func:`pair_offsets` result under ``key``.

    Returns:
        dict: ``boxes`` (measured), ``verdicts`` (with a verdict),
        ``by_verdict`` (count per verdict), ``disagree``, ``confident``
        (matched), ``median``, ``p95``, ``max`` (of their ``|d|``, pixels
        of the original images), ``pairs``, ``flagged_pairs``,
        ``per_folder`` (the same per visible folder, without ``d``) and
        ``d`` (every matched ``|d|``, for the histogram).
    """
    results, folders = [], {}
    for r in records:
        result = r.get(key)
        if not result:
            continue
        results.append(result)
        folders.setdefault(folder_of(r.get('img_path')), []).append(result)
    summary = _tally(results)
    summary['per_folder'] = {}
    for folder, found in sorted(folders.items()):
        entry = _tally(found)
        entry.pop('d')
        summary['per_folder'][folder] = entry
    return summary


def _share(part: int, whole: int) -> str:
    return f'{100.0 * part / whole:.0f}%' if whole else '-'


def format_summary(summary: Optional[Dict], max_folders: int = 10) -> str:
    """Lines of the text report."""
    if not summary or not summary.get('pairs'):
        return 'per-box offsets: no pair with boxes measured'
    n = summary['by_verdict']
    lines = [
        f"per-box visible/infrared check: {summary['verdicts']} of "
        f"{summary['boxes']} boxes with a verdict "
        f"({_share(summary['verdicts'], summary['boxes'])}) in "
        f"{summary['pairs']} pairs: {n[MATCHED]} matched, {n[WARM]} warm "
        f"here, {n[OUTLINE]} outline here, {n[EMPTY]} nothing here; "
        f"{summary['flagged_pairs']} pairs flagged (more boxes disagree "
        'than agree)',
        f"per-box visible/infrared offsets |d| (original px) of the "
        f"{summary['confident']} matched boxes: median {summary['median']}, "
        f"95th percentile {summary['p95']}, max {summary['max']}"]
    folders = summary.get('per_folder') or {}
    if len(folders) > 1:
        worst = sorted(folders.items(), key=lambda kv: (
            -kv[1]['flagged_pairs'] / max(1, kv[1]['pairs']),
            -(kv[1]['median'] or 0.0)))
        for folder, s in worst[:max_folders]:
            lines.append(
                f"  {folder}: {s['verdicts']}/{s['boxes']} boxes with a "
                f"verdict, {s['by_verdict'][EMPTY]} nothing here, median "
                f"|d| {s['median']} (p95 {s['p95']}) of {s['confident']} "
                f"matched, {s['flagged_pairs']}/{s['pairs']} pairs flagged")
        if len(folders) > max_folders:
            lines.append(f'  ... {len(folders) - max_folders} more folders '
                         'in the JSON report (--json)')
    return '\n'.join(lines)


def benchmark(size: Tuple[int, int] = (1280, 1024), pairs: int = 20) -> Dict:
    """Boxes per second of :func:`pair_offsets` on one thread, on synthetic
    LLVIP-like pairs of ``size`` with people 100-500 px tall (decoded
    images). ``python benchmarks/object_offsets.py`` prints it."""
    import time

    import cv2

    from mmsafe.datasets.synthetic_llvip import render_pair, synthetic_params
    cv2.setNumThreads(1)
    params = synthetic_params(img_size=size, person_height=(100, 500),
                              empty_ratio=0.0)
    scenes = [render_pair(params, 'train', i) for i in range(4)]
    scenes = [s for s in scenes if s[2]] or scenes
    pair_offsets(*scenes[0])  # warm-up
    boxes = confident = verdicts = 0
    start = time.perf_counter()
    for i in range(pairs):
        vis, ir, b = scenes[i % len(scenes)]
        result = pair_offsets(vis, ir, b)
        boxes += len(b)
        confident += result['confident']
        verdicts += result['verdicts']
    elapsed = time.perf_counter() - start
    return dict(size=list(size), pairs=pairs, boxes=boxes,
                confident=confident, verdicts=verdicts,
                ms_per_box=round(1000 * elapsed / max(1, boxes), 3),
                boxes_per_second=round(boxes / elapsed, 1))


if __name__ == '__main__':
    print(benchmark())

"""Per-box visible/infrared offsets: is each annotated person where the box
says, in both modalities?

:mod:`.pair_alignment` compares whole images. An infrared file taken a
moment earlier or later in the same fixed-camera scene passes it (the
background matches), while the people are elsewhere than the boxes; and a
weakly aligned dataset (visible and infrared people offset by several
pixels, as in KAIST) passes it too. Here each box is measured on its own:
the gradient-magnitude map of the visible image inside the box (plus a
small margin) is correlated (``cv2.matchTemplate``, ``TM_CCOEFF_NORMED``)
with the infrared map over a search window around it (``search`` times
the box's longer side), at a working scale where the box's longer side
has ``work_size`` map pixels; the peak is refined to a fraction of a map
pixel (a parabola through its neighbours). The infrared content found
there is then looked for back in the visible window, and must lead back
to the box (``consistency``): a chance match of background edges (a kerb
line through a faint person) does not.

The offset ``(dx, dy)`` is where the box's content sits in the infrared
image minus where it sits in the visible one, in pixels of the original
image (the pipeline's ``scale_factor`` and horizontal flip undone). A box
gets no estimate (``confident`` False, ``dx``/``dy`` None) when it is too
small (``min_box`` pixels on its shorter side), has no structure
(``min_structure``), its best match is weak (``min_corr``), lies on the
edge of the search window (the true one may be beyond it) or does not
lead back. A person whose box and margin are dominated by strong
background edges can still read as 0 (the background matches unshifted):
the measure errs towards no flag.

A pair is flagged ``pair_objects_offset`` when the median ``|d|`` of its
confident boxes exceeds ``max_offset`` pixels (original resolution).

Used by ``tools/check_dataset.py`` (every pair, as its pipeline outputs
it; a distribution per dataset and per folder) and ``FirstBatchStatsHook``
(the first pairs).
"""
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

from .pair_alignment import correlation, gradient_magnitude, hwc_view

FINDING = 'pair_objects_offset'


def _grey(crop: np.ndarray) -> np.ndarray:
    """A crop (an ``hwc_view``) as contiguous float32 grey."""
    crop = crop.astype(np.float32)
    if crop.ndim == 3:
        crop = crop[..., 0] if crop.shape[2] == 1 else crop.mean(axis=2)
    return np.ascontiguousarray(crop)


def _boxes(boxes) -> np.ndarray:
    if boxes is None:
        return np.zeros((0, 4), np.float32)
    if hasattr(boxes, 'tensor'):  # mmdet BaseBoxes
        boxes = boxes.tensor
    if hasattr(boxes, 'detach'):
        boxes = boxes.detach().cpu().numpy()
    return np.asarray(boxes, dtype=np.float32).reshape(-1, 4)


def _gradient(crop: np.ndarray, scale: float) -> np.ndarray:
    """Gradient magnitude of an image crop at ``scale`` (area-downscaled,
    then grey)."""
    grey = crop
    if scale < 1.0:
        if grey.dtype not in (np.uint8, np.float32):
            grey = grey.astype(np.float32)
        h, w = grey.shape[:2]
        size = (max(4, int(round(w * scale))), max(4, int(round(h * scale))))
        grey = cv2.resize(np.ascontiguousarray(grey), size,
                          interpolation=cv2.INTER_AREA)
    return gradient_magnitude(_grey(grey))


def _match(window: np.ndarray, source: np.ndarray, ox: int, oy: int,
           tw: int, th: int) -> Tuple[float, float, Optional[float],
                                      Optional[float]]:
    """Find ``source``'s box (at ``ox, oy``, ``tw x th``) in ``window``:
    best correlation, correlation unshifted, and the shift in map pixels
    (None when the best match is on the edge of the search window)."""
    result = correlation(window, source[oy:oy + th, ox:ox + tw])
    iy, ix = np.unravel_index(int(np.argmax(result)), result.shape)
    best, zero = float(result[iy, ix]), float(result[oy, ox])
    if iy in (0, result.shape[0] - 1) or ix in (0, result.shape[1] - 1):
        return best, zero, None, None
    fx, fy = _subpixel(result, iy, ix)
    return best, zero, ix + fx - ox, iy + fy - oy


def _subpixel(result: np.ndarray, iy: int, ix: int) -> Tuple[float, float]:
    """Parabola through the peak and its neighbours, per axis."""
    def vertex(a: float, b: float, c: float) -> float:
        den = a - 2 * b + c
        return 0.0 if den >= 0 else float(np.clip(0.5 * (a - c) / den,
                                                  -0.5, 0.5))
    fy = vertex(result[iy - 1, ix], result[iy, ix], result[iy + 1, ix])
    fx = vertex(result[iy, ix - 1], result[iy, ix], result[iy, ix + 1])
    return fx, fy


def box_offset(visible: np.ndarray,
               infrared: np.ndarray,
               box: Sequence[float],
               search: float = 0.75,
               min_search: float = 16.0,
               margin: float = 0.1,
               work_size: int = 80,
               min_box: float = 8.0,
               min_structure: float = 2.0,
               min_corr: float = 0.5,
               consistency: float = 1.5) -> Dict:
    """Offset of one box's content between two images (same size).

    Args:
        visible, infrared: ``H x W (x C)`` arrays (``hwc_view``), same
            size.
        box: ``(x1, y1, x2, y2)`` in their pixels.
        search (float): search radius as a share of the box's longer side
            (at least ``min_search`` pixels).
        margin (float): margin around the box in the template, as a share
            of each side.
        work_size (int): map pixels of the box's longer side.
        min_box (float): boxes with a shorter side below this get no
            estimate.
        min_structure (float): mean gradient magnitude (grey levels per
            pixel) below which the visible box has no structure.
        min_corr (float): a weaker best match gives no estimate (0.5: on
            real night pairs, dark visible crops give chance matches near
            0.3-0.45 far from the person).
        consistency (float): map pixels by which the way back (the
            infrared content found, looked for in the visible window) may
            miss the box.

    Returns:
        dict: ``dx``, ``dy`` (pixels of these images; None without an
        estimate), ``corr`` (best match), ``corr_zero`` (match unshifted),
        ``confident`` and, without an estimate, ``reason``.
    """
    h, w = visible.shape[:2]
    x1, y1, x2, y2 = (float(v) for v in box)
    bw, bh = x2 - x1, y2 - y1
    out = dict(dx=None, dy=None, corr=None, corr_zero=None, confident=False)
    if min(bw, bh) < min_box:
        out['reason'] = 'small'
        return out
    scale = min(1.0, work_size / max(bw, bh))
    radius = max(min_search, search * max(bw, bh))
    mx, my = margin * bw, margin * bh
    # template: the box plus margin, clipped to the image
    tx1, ty1 = int(max(0, np.floor(x1 - mx))), int(max(0, np.floor(y1 - my)))
    tx2, ty2 = int(min(w, np.ceil(x2 + mx))), int(min(h, np.ceil(y2 + my)))
    # window: the template plus the search radius, clipped
    wx1, wy1 = int(max(0, tx1 - radius)), int(max(0, ty1 - radius))
    wx2, wy2 = int(min(w, tx2 + radius)), int(min(h, ty2 + radius))
    ir_map = _gradient(infrared[wy1:wy2, wx1:wx2], scale)
    vis_map = _gradient(visible[wy1:wy2, wx1:wx2], scale)
    # the template cut from the visible window's map (same scale and grid)
    sx = ir_map.shape[1] / float(wx2 - wx1)
    sy = ir_map.shape[0] / float(wy2 - wy1)
    ox, oy = int(round((tx1 - wx1) * sx)), int(round((ty1 - wy1) * sy))
    tw = max(4, int(round((tx2 - tx1) * sx)))
    th = max(4, int(round((ty2 - ty1) * sy)))
    if oy + th > vis_map.shape[0] or ox + tw > vis_map.shape[1] or \
            vis_map.shape[0] < th + 2 or vis_map.shape[1] < tw + 2:
        out['reason'] = 'border'
        return out
    if float(vis_map[oy:oy + th, ox:ox + tw].mean()) < min_structure:
        out['reason'] = 'no_structure'
        return out
    # the visible box found in the infrared window, then the infrared
    # content found there looked for back in the visible window: a real
    # match leads back to the box, a chance match elsewhere (a kerb line
    # through a faint person) does not
    fwd = _match(ir_map, vis_map, ox, oy, tw, th)
    out['corr'] = round(fwd[0], 4)
    out['corr_zero'] = round(fwd[1], 4)
    if out['corr'] < min_corr:
        out['reason'] = 'weak'
        return out
    if fwd[2] is None:
        # the best match is on the edge of the search window: the true one
        # may lie beyond it
        out['reason'] = 'edge'
        return out
    bx, by = ox + int(round(fwd[2])), oy + int(round(fwd[3]))
    bwd = _match(vis_map, ir_map, bx, by, tw, th)
    if bwd[2] is None or np.hypot(fwd[2] + bwd[2],
                                  fwd[3] + bwd[3]) > consistency:
        out['reason'] = 'inconsistent'
        return out
    out['dx'] = float(fwd[2] / sx)
    out['dy'] = float(fwd[3] / sy)
    out['confident'] = True
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


def pair_offsets(visible,
                 infrared,
                 boxes,
                 scale_factor=None,
                 flip_direction: Optional[str] = None,
                 max_offset: float = 8.0,
                 **kwargs) -> Dict:
    """Per-box offsets of one pair and its verdict.

    Args:
        visible, infrared: the two images (``H x W (x C)`` arrays or
            ``[C, H, W]`` tensors), same size.
        boxes: ``(N, 4)`` boxes in their pixels.
        scale_factor: ``(w_scale, h_scale)`` from the original image to
            these (the pipeline's ``scale_factor``); None: 1.
        flip_direction (str, optional): the pipeline's flip of both.
        max_offset (float): a median ``|d|`` above this (original pixels)
            flags the pair.
        **kwargs: see :func:`box_offset`.

    Returns:
        dict: ``boxes`` (per box: ``box`` as given, ``dx``, ``dy``, ``d``
        in original pixels or None, ``corr``, ``corr_zero``,
        ``confident``), ``confident`` (count), ``median_d`` (None without
        a confident box), ``flagged``, ``max_offset``.
    """
    vis, ir = hwc_view(visible), hwc_view(infrared)
    if vis.shape[:2] != ir.shape[:2]:
        raise ValueError(f'pair_offsets: visible {vis.shape} and infrared '
                         f'{ir.shape} differ in size')
    rows = []
    for box in _boxes(boxes):
        r = box_offset(vis, ir, box, **kwargs)
        row = dict(box=[round(float(v), 1) for v in box], dx=None, dy=None,
                   d=None, corr=r['corr'], corr_zero=r['corr_zero'],
                   confident=r['confident'])
        if r['confident']:
            dx, dy = _to_original(r['dx'], r['dy'], scale_factor,
                                  flip_direction)
            row.update(dx=round(dx, 2), dy=round(dy, 2),
                       d=round(float(np.hypot(dx, dy)), 2))
        else:
            row['reason'] = r.get('reason')
        rows.append(row)
    ds = [r['d'] for r in rows if r['confident']]
    median = float(np.median(ds)) if ds else None
    return dict(boxes=rows, confident=len(ds),
                median_d=None if median is None else round(median, 2),
                flagged=median is not None and median > max_offset,
                max_offset=float(max_offset))


def offsets_message(result: Dict) -> str:
    """What a user reads for a flagged pair."""
    shown = ', '.join(f'({r["dx"]:+.1f}, {r["dy"]:+.1f})'
                      for r in result['boxes'] if r['confident'])
    return (f'the people in the infrared image are offset from their boxes '
            f'in the visible one: median |d| {result["median_d"]:.1f} px '
            f'over {result["confident"]} boxes (> {result["max_offset"]:g}; '
            f'offsets (dx, dy) in original pixels: {shown}); the partner '
            'is from another moment, or the modalities are not registered '
            '(re-annotate per modality or register them)')


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
        return dict(boxes=0, median=None, p95=None, max=None)
    arr = np.asarray(ds, dtype=np.float64)
    return dict(boxes=int(arr.size), median=round(float(np.median(arr)), 2),
                p95=round(float(np.percentile(arr, 95)), 2),
                max=round(float(arr.max()), 2))


def offsets_summary(records: Sequence[Dict], key: str = 'offsets') -> Dict:
    """The distribution of ``|d|`` over the confident boxes of an audit.

    Args:
        records (Sequence[dict]): audit records with ``img_path`` and a
            :func:`pair_offsets` result under ``key``.

    Returns:
        dict: ``boxes`` (measured), ``confident``, ``median``, ``p95``,
        ``max`` (pixels of the original images), ``pairs``,
        ``flagged_pairs``, ``per_folder`` (the same per visible folder) and
        ``d`` (every confident ``|d|``, for the histogram).
    """
    every: List[float] = []
    folders: Dict[str, List[float]] = {}
    folder_pairs: Dict[str, List[int]] = {}
    total = pairs = flagged = 0
    for r in records:
        result = r.get(key)
        if not result:
            continue
        pairs += 1
        flagged += bool(result['flagged'])
        total += len(result['boxes'])
        ds = [b['d'] for b in result['boxes'] if b['confident']]
        every += ds
        folder = folder_of(r.get('img_path'))
        folders.setdefault(folder, []).extend(ds)
        counts = folder_pairs.setdefault(folder, [0, 0])
        counts[0] += 1
        counts[1] += bool(result['flagged'])
    per_folder = {}
    for folder, ds in sorted(folders.items()):
        entry = _stats(ds)
        entry.update(pairs=folder_pairs[folder][0],
                     flagged_pairs=folder_pairs[folder][1])
        per_folder[folder] = entry
    summary = dict(boxes=total, confident=len(every), pairs=pairs,
                   flagged_pairs=flagged, per_folder=per_folder,
                   d=[round(float(v), 2) for v in every])
    stats = _stats(every)
    stats.pop('boxes')
    summary.update(stats)
    return summary


def format_summary(summary: Optional[Dict], max_folders: int = 10) -> str:
    """Lines of the text report."""
    if not summary or not summary.get('pairs'):
        return 'per-box offsets: no pair with boxes measured'
    lines = [f"per-box visible/infrared offsets |d| (original px): "
             f"{summary['confident']} of {summary['boxes']} boxes measured "
             f"confidently in {summary['pairs']} pairs; median "
             f"{summary['median']}, 95th percentile {summary['p95']}, max "
             f"{summary['max']}; {summary['flagged_pairs']} pairs flagged"]
    folders = summary.get('per_folder') or {}
    if len(folders) > 1:
        worst = sorted(folders.items(),
                       key=lambda kv: -(kv[1]['median'] or 0.0))
        for folder, s in worst[:max_folders]:
            lines.append(f"  {folder}: {s['boxes']} boxes, median "
                         f"{s['median']}, p95 {s['p95']}, "
                         f"{s['flagged_pairs']}/{s['pairs']} pairs flagged")
        if len(folders) > max_folders:
            lines.append(f'  ... {len(folders) - max_folders} more folders '
                         'in the JSON report (--json)')
    return '\n'.join(lines)


def histogram_image(ds: Sequence[float], max_offset: float = 8.0,
                    bins: int = 24, size: Tuple[int, int] = (640, 360)
                    ) -> np.ndarray:
    """A bar chart of ``|d|`` (cv2 drawing), with the flag threshold."""
    width, height = size
    img = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 50, 15, 30, 40
    arr = np.asarray(ds, dtype=np.float64)
    hi = max(2.0 * max_offset, float(arr.max()) if arr.size else 1.0)
    hi = float(np.ceil(hi))
    counts, edges = np.histogram(arr, bins=bins, range=(0.0, hi))
    peak = max(1, int(counts.max()) if counts.size else 1)
    pw, ph = width - left - right, height - top - bottom
    black = (0, 0, 0)
    cv2.line(img, (left, top + ph), (left + pw, top + ph), black, 1)
    cv2.line(img, (left, top), (left, top + ph), black, 1)
    for i, c in enumerate(counts):
        x1 = left + int(i * pw / bins)
        x2 = left + int((i + 1) * pw / bins) - 1
        y1 = top + ph - int(round(c * ph / peak))
        cv2.rectangle(img, (x1, y1), (x2, top + ph), (180, 120, 40), -1)
    xt = left + int(max_offset / hi * pw)
    cv2.line(img, (xt, top), (xt, top + ph), (0, 0, 255), 1)
    font = cv2.FONT_HERSHEY_SIMPLEX
    cv2.putText(img, f'max_offset {max_offset:g}', (xt + 3, top + 12), font,
                0.4, (0, 0, 255), 1)
    for k in range(5):
        v = hi * k / 4
        x = left + int(v / hi * pw)
        cv2.putText(img, f'{v:.0f}', (x - 6, top + ph + 15), font, 0.4,
                    black, 1)
    cv2.putText(img, str(peak), (5, top + 10), font, 0.4, black, 1)
    cv2.putText(img, '0', (30, top + ph), font, 0.4, black, 1)
    cv2.putText(img, '|d| (px, original resolution)',
                (left + pw // 2 - 100, height - 8), font, 0.45, black, 1)
    med = float(np.median(arr)) if arr.size else float('nan')
    cv2.putText(img, f'per-box visible/infrared offsets: {arr.size} boxes, '
                f'median {med:.1f} px', (left, 18), font, 0.45, black, 1)
    return img


def write_histogram(path: str, ds: Sequence[float],
                    max_offset: float = 8.0) -> str:
    """Write :func:`histogram_image` as a PNG at ``path``."""
    if not cv2.imwrite(path, histogram_image(ds, max_offset)):
        raise OSError(f'could not write {path}')
    return path


def draw_offsets(canvas: np.ndarray, result: Optional[Dict],
                 width: int, gap: int, scale_factor=None,
                 flip_direction: Optional[str] = None) -> np.ndarray:
    """Draw each box's offset on a ``visible | infrared`` canvas
    (:func:`mmsafe.tools_lib.pair_vis.draw_pair`): on the infrared half an
    arrow from the box's centre to where its content is, and ``|d|`` as a
    label (original pixels); boxes without an estimate are marked ``?``.

    Args:
        canvas: the drawn pair (changed in place and returned).
        result: a :func:`pair_offsets` result of the same boxes.
        width (int): width of the visible half; ``gap``: pixels between.
        scale_factor, flip_direction: the sample's, to turn the offsets
            back into the drawn (pipeline) pixels.
    """
    if not result:
        return canvas
    sf = np.ones(2)
    if scale_factor is not None:
        arr = np.asarray(scale_factor, dtype=np.float64).reshape(-1)
        sf = arr[:2] if arr.size >= 2 else np.repeat(arr[:1], 2)
    base = width + gap
    for r in result['boxes']:
        x1, y1, x2, y2 = r['box']
        cx, cy = base + (x1 + x2) / 2.0, (y1 + y2) / 2.0
        p = (int(round(cx)), int(round(cy)))
        if not r['confident']:
            cv2.putText(canvas, '?', p, cv2.FONT_HERSHEY_SIMPLEX, 0.4,
                        (200, 200, 200), 1)
            continue
        dx, dy = r['dx'] * sf[0], r['dy'] * sf[1]
        if flip_direction in ('horizontal', 'diagonal'):
            dx = -dx
        if flip_direction in ('vertical', 'diagonal'):
            dy = -dy
        bad = r['d'] > result['max_offset']
        color = (0, 0, 255) if bad else (255, 255, 0)
        q = (int(round(cx + dx)), int(round(cy + dy)))
        cv2.arrowedLine(canvas, p, q, color, 1, tipLength=0.3)
        cv2.circle(canvas, p, 1, color, -1)
        cv2.putText(canvas, f'{r["d"]:.0f}px',
                    (int(round(base + x1)), int(round(y2)) + 10),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.35, color, 1)
    return canvas


def benchmark(size: Tuple[int, int] = (1280, 1024), pairs: int = 20) -> Dict:
    """Boxes per second of :func:`pair_offsets` on one thread, on synthetic
    LLVIP-like pairs of ``size`` with people 100-500 px tall (decoded
    images). ``python benchmarks/object_offsets.py`` prints it."""
    import time
    from mmsafe.datasets.synthetic_llvip import render_pair, synthetic_params
    cv2.setNumThreads(1)
    params = synthetic_params(img_size=size, person_height=(100, 500),
                              empty_ratio=0.0)
    scenes = [render_pair(params, 'train', i) for i in range(4)]
    scenes = [s for s in scenes if s[2]] or scenes
    pair_offsets(*scenes[0])  # warm-up
    boxes = confident = 0
    start = time.perf_counter()
    for i in range(pairs):
        vis, ir, b = scenes[i % len(scenes)]
        result = pair_offsets(vis, ir, b)
        boxes += len(b)
        confident += result['confident']
    elapsed = time.perf_counter() - start
    return dict(size=list(size), pairs=pairs, boxes=boxes,
                confident=confident,
                ms_per_box=round(1000 * elapsed / max(1, boxes), 3),
                boxes_per_second=round(boxes / elapsed, 1))


if __name__ == '__main__':
    print(benchmark())

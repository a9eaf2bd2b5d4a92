"""Does the infrared image line up with its visible partner? A cheap,
per-pair measure of image-content alignment.

Visible and infrared intensities are unrelated (a warm person is dim in
visible), but their structure is shared: the outlines of people, walls and
kerbs show in both. Each image is reduced to a small map of its gradient
magnitude (grey, area-downscaled to ``width`` columns, Sobel, a light
blur), and the infrared map is correlated with the visible one
(``cv2.matchTemplate``, normalised correlation) over every shift up to
``max_shift`` of the size, as it is and mirrored left-right. For a
registered pair the best match is the unshifted, unmirrored one. The pair
is flagged when:

* ``mirrored``: the mirrored infrared matches clearly better than any
  unmirrored placement (a flip on one modality, or a mirrored folder);
* ``shifted``: a shifted placement matches clearly better than the
  unshifted one (a crop/shift on one modality, or a partner from another
  frame or scene that happens to match elsewhere).

A single pair whose partner is from another frame often shows no match at
all, but so does a registered pair with little common structure (an
empty night scene). Unrelated partners are therefore judged over a group
of pairs (:func:`unrelated_pairs`): when hardly any pair of the group
matches unshifted, the partners are from other frames (a permuted or
mis-sorted infrared folder), and the pairs without a match are named.

"Clearly" is a margin on the correlation (``margin``) and a ratio to the
unshifted match (``ratio``), and a match needs ``min_corr``, so that a weak
pair with little structure is not flagged by noise. The defaults leave all
400 pairs of the synthetic demo unflagged and flag about 70% of them when
the infrared images are mirrored or shifted by 10%.

Used by ``tools/check_dataset.py`` (every pair, as its pipeline outputs
it) and ``FirstBatchStatsHook`` (the first pairs, as the model receives
them).
"""
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

from mmsafe.errors import MMSafeValueError

ALIGNED, MIRRORED, SHIFTED = 'aligned', 'mirrored', 'shifted'


def hwc_view(img) -> np.ndarray:
    """An ``H x W (x C)`` view of an array or ``[C, H, W]`` tensor."""
    if hasattr(img, 'detach'):
        img = img.detach().cpu().numpy()
    img = np.asarray(img)
    if img.ndim == 3 and img.shape[0] in (1, 3) and img.shape[2] not in (1,
                                                                        3):
        img = img.transpose(1, 2, 0)
    return img


def structure_map(img, width: int = 160) -> np.ndarray:
    """Gradient-magnitude map of an image, downscaled to ``width`` columns.

    Args:
        img: ``H x W (x C)`` array or ``[C, H, W]`` tensor, any dtype.
        width (int): columns of the map (smaller images keep their size).

    Returns:
        np.ndarray: float32 ``h x width`` map.
    """
    img = hwc_view(img)
    # pipelines may hand over float images (to_float32); cv2 resizes
    # float32, not float64
    if img.dtype not in (np.uint8, np.float32):
        img = img.astype(np.float32)
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[..., 0]
    h, w = img.shape[:2]
    if w > width:
        # shrink first (area averaging, in the input dtype): the rest then
        # works on a few thousand pixels whatever the image size
        size = (int(width), max(8, int(round(h * width / w))))
        img = cv2.resize(np.ascontiguousarray(img), size,
                         interpolation=cv2.INTER_AREA)
    grey = img.astype(np.float32)
    if grey.ndim == 3:
        grey = grey.mean(axis=2)
    return cv2.GaussianBlur(gradient_magnitude(grey), (0, 0), 1.0)


def gradient_magnitude(grey: np.ndarray) -> np.ndarray:
    """Sobel gradient magnitude of a float32 grey image, lightly blurred
    first (pixel noise would dominate the gradients of dark, night,
    images)."""
    grey = cv2.GaussianBlur(grey, (0, 0), 1.0)
    gx = cv2.Sobel(grey, cv2.CV_32F, 1, 0, ksize=3)
    gy = cv2.Sobel(grey, cv2.CV_32F, 0, 1, ksize=3)
    return cv2.magnitude(gx, gy)


def correlation(image: np.ndarray, template: np.ndarray) -> np.ndarray:
    """Normalised correlation (``TM_CCOEFF_NORMED``) of ``template`` at
    every place in ``image``; 0 where it is undefined (a flat patch)."""
    result = cv2.matchTemplate(image, np.ascontiguousarray(template),
                               cv2.TM_CCOEFF_NORMED)
    return np.nan_to_num(result, nan=0.0, posinf=0.0, neginf=0.0)


def _match(ref: np.ndarray, moving: np.ndarray, mx: int,
           my: int) -> np.ndarray:
    """Normalised correlation of ``moving``'s centre with ``ref`` at every
    shift in ``[-my, my] x [-mx, mx]`` (zero shift at ``[my, mx]``)."""
    h, w = moving.shape
    return correlation(ref, moving[my:h - my, mx:w - mx])


def measure_alignment(visible,
                      infrared,
                      width: int = 160,
                      max_shift: float = 0.1,
                      margin: float = 0.15,
                      ratio: float = 0.6,
                      min_corr: float = 0.3,
                      min_shift: int = 2) -> Dict:
    """Measure how well ``infrared`` lines up with ``visible``.

    Args:
        visible: the visible image (``H x W x C`` array or ``[C, H, W]``).
        infrared: the infrared image, same size.
        width (int): columns of the structure maps.
        max_shift (float): largest shift tried, as a fraction of each side.
        margin (float): how much better (in correlation) a mirrored or
            shifted placement must match to flag the pair.
        ratio (float): and the unshifted match must be below ``ratio`` times
            that better match.
        min_corr (float): below this, a placement counts as no match.
        min_shift (int): shifts of fewer map pixels count as unshifted
            (registration tolerance).

    Returns:
        dict: ``verdict`` (``'aligned'``, ``'mirrored'``, ``'shifted'``),
        ``matched`` (the unshifted placement reaches ``min_corr``),
        ``corr`` (unshifted), ``best_corr`` and ``best_shift`` (``(dx, dy)`` in image pixels) of the unmirrored
        placements, ``mirrored_corr`` (best mirrored placement) and
        ``message`` (empty when aligned).
    """
    vis_map = structure_map(visible, width)
    ir_map = structure_map(infrared, width)
    if vis_map.shape != ir_map.shape:
        raise MMSafeValueError(
            f'measure_alignment: visible {vis_map.shape} and '
            f'infrared {ir_map.shape} maps differ in size; '
            'the images must have the same size')
    h, w = vis_map.shape
    mx = max(1, int(round(max_shift * w)))
    my = max(1, int(round(max_shift * h)))
    direct = _match(vis_map, ir_map, mx, my)
    mirror = _match(vis_map, np.ascontiguousarray(ir_map[:, ::-1]), mx, my)
    # registration tolerance: the best match within min_shift counts as
    # the unshifted one
    near = direct[max(0, my - min_shift + 1):my + min_shift,
                  max(0, mx - min_shift + 1):mx + min_shift]
    corr_near = float(near.max())
    iy, ix = np.unravel_index(int(np.argmax(direct)), direct.shape)
    best = float(direct[iy, ix])
    scale = hwc_view(visible).shape[1] / float(w)
    shift: Tuple[int, int] = (int(round((ix - mx) * scale)),
                              int(round((iy - my) * scale)))
    mirrored = float(mirror.max())
    verdict, message = ALIGNED, ''
    if mirrored >= min_corr and mirrored > max(best, corr_near) + margin \
            and corr_near < ratio * mirrored:
        verdict = MIRRORED
        message = (f'the infrared image matches its visible partner '
                   f'MIRRORED left-right (correlation {mirrored:.2f}) far '
                   f'better than as it is ({max(best, corr_near):.2f})')
    elif best >= min_corr and best > corr_near + margin and \
            corr_near < ratio * best:
        verdict = SHIFTED
        message = (f'the infrared image matches its visible partner best '
                   f'SHIFTED by {shift} px (dx, dy) (correlation '
                   f'{best:.2f} vs {corr_near:.2f} unshifted): shifted, '
                   'cropped, or from another frame')
    return dict(verdict=verdict, matched=corr_near >= min_corr,
                corr=round(corr_near, 4),
                best_corr=round(best, 4), best_shift=list(shift),
                mirrored_corr=round(mirrored, 4), message=message)


def alignment_flag(result: Optional[Dict]) -> bool:
    """Whether a :func:`measure_alignment` result flags the pair."""
    return bool(result) and result['verdict'] != ALIGNED


def unrelated_pairs(results: Sequence[Dict],
                    min_pairs: int = 8,
                    min_matched: float = 0.1) -> List[int]:
    """Pairs whose partner is from another frame, judged over a group.

    Args:
        results (Sequence[dict]): :func:`measure_alignment` results of the
            group's pairs.
        min_pairs (int): smaller groups are not judged.
        min_matched (float): the group is judged unrelated when fewer than
            this share of its pairs match unshifted (registered pairs of
            the synthetic demo: 72% match; mirrored, shifted or permuted
            partners: under 1%).

    Returns:
        list[int]: positions (in ``results``) of the pairs without an
        unshifted match and not already flagged mirrored or shifted, when
        the group is judged unrelated; else empty.
    """
    if len(results) < min_pairs:
        return []
    matched = sum(bool(r['matched']) for r in results)
    if matched >= min_matched * len(results):
        return []
    return [i for i, r in enumerate(results)
            if not r['matched'] and r['verdict'] == ALIGNED]


def unrelated_message(result: Dict, results: Sequence[Dict]) -> str:
    """What a user reads for a pair named by :func:`unrelated_pairs`
    (``results``: the whole group)."""
    matched = sum(bool(r['matched']) for r in results)
    counts = {v: sum(r['verdict'] == v for r in results)
              for v in (MIRRORED, SHIFTED)}
    if counts[MIRRORED] + counts[SHIFTED]:
        cause = (f'{counts[MIRRORED]} pairs match only mirrored and '
                 f'{counts[SHIFTED]} only shifted: the infrared images are '
                 + ('mirrored' if counts[MIRRORED] >= counts[SHIFTED] else
                    'shifted') + ' against the visible ones')
    else:
        cause = ('the partners are from other frames or scenes (a permuted '
                 'or mis-sorted infrared folder, or a wrong partner rule)')
    return (f'the infrared image shares no structure with its visible '
            f'partner (correlation {result["corr"]:.2f}), and only '
            f'{matched} of {len(results)} pairs checked match unshifted; '
            f'{cause}')


#: finding kinds of tools/check_dataset.py, per verdict
FINDING = {MIRRORED: 'pair_mirrored', SHIFTED: 'pair_shifted'}


def audit_alignment(modalities: Optional[Dict]
                    ) -> Tuple[Optional[Dict], List[Tuple[str, str]]]:
    """Measure one pipeline output for ``tools/check_dataset.py``.

    Args:
        modalities (dict | None): ``{'visible': x, 'infrared': y}`` of a
            packed sample.

    Returns:
        tuple: the :func:`measure_alignment` result (None when the sample
        is not a same-size pair) and ``[(finding kind, message)]``.
    """
    if not modalities or 'visible' not in modalities or \
            'infrared' not in modalities:
        return None, []
    vis, ir = modalities['visible'], modalities['infrared']
    if tuple(vis.shape[-2:]) != tuple(ir.shape[-2:]):
        return None, []
    result = measure_alignment(vis, ir)
    if not alignment_flag(result):
        return result, []
    return result, [(FINDING[result['verdict']], result['message'] +
                     '; see --show-dir')]


def add_unrelated_findings(records: List[Dict], make_issue) -> int:
    """Judge the pairs of an audit as a group (:func:`unrelated_pairs`) and
    add a ``pair_unrelated`` finding to each pair named.

    Args:
        records (list[dict]): audit records with an ``alignment`` result.
        make_issue (callable): ``(kind, message, source) -> dict``.

    Returns:
        int: how many pairs were named.
    """
    measured = [r for r in records if r.get('alignment')]
    results = [r['alignment'] for r in measured]
    named = unrelated_pairs(results)
    for i in named:
        measured[i]['issues'].append(make_issue(
            'pair_unrelated',
            unrelated_message(results[i], results) +
            '; see --show-dir', 'alignment'))
    return len(named)


def flagged_records(records: List[Dict]) -> List[Dict]:
    """Audit records with an alignment finding, in dataset order."""
    kinds = set(FINDING.values()) | {'pair_unrelated'}
    return [r for r in records
            if any(i['kind'] in kinds for i in r.get('issues', []))]


def benchmark(size: Tuple[int, int] = (1280, 1024), pairs: int = 50) -> Dict:
    """Pairs per second of :func:`measure_alignment` on one thread, on
    synthetic LLVIP-like pairs of ``size`` (decoded images; decoding the
    files is not counted). ``python -m mmsafe.analysis.pair_alignment``
    prints it."""
    import time
    from mmsafe.datasets.synthetic_llvip import render_pair, synthetic_params
    cv2.setNumThreads(1)
    params = synthetic_params(img_size=size, person_height=(100, 500))
    images = [render_pair(params, 'train', i)[:2] for i in range(4)]
    measure_alignment(*images[0])  # warm-up
    start = time.perf_counter()
    for i in range(pairs):
        measure_alignment(*images[i % len(images)])
    elapsed = time.perf_counter() - start
    return dict(size=list(size), pairs=pairs,
                ms_per_pair=round(1000 * elapsed / pairs, 2),
                pairs_per_second=round(pairs / elapsed, 1))


if __name__ == '__main__':
    print(benchmark())

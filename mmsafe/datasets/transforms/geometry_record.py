"""Per-modality geometry of a paired sample.

MMDetection's geometric transforms compose what they do to ``img`` into
``results['homography_matrix']`` (a 3x3 matrix from the original image to
the current one). That matrix is the visible geometry. The infrared
geometry lives beside it in ``results['ir_homography_matrix']``: only the
transforms that move the infrared image update it (the paired transforms,
see :func:`record_step`). A step log (``results['pair_geometry_log']``)
names, per step that changed a geometry, the transform and the modalities
it moved, so that a divergence can be traced to the transform that made
it.

Nothing here touches pixels, boxes or random state: the keys are
bookkeeping only and are not packed into the data sample.
"""
from typing import List, Optional, Tuple

import numpy as np

VISIBLE_KEY = 'homography_matrix'
INFRARED_KEY = 'ir_homography_matrix'
LOG_KEY = 'pair_geometry_log'
BOTH, VISIBLE, INFRARED = 'both', 'visible', 'infrared'

#: set on a transform class (``pair_aware = True``) that keeps the two
#: geometries itself: it moves both images identically and records it, or
#: it never moves either
PAIR_AWARE_ATTR = 'pair_aware'


def is_pair_aware(transform) -> bool:
    """Whether ``transform`` keeps the per-modality geometry itself."""
    return bool(getattr(transform, PAIR_AWARE_ATTR, False))


def homography(results: dict, key: str) -> np.ndarray:
    """The 3x3 homography stored under ``key`` (identity when absent)."""
    mat = results.get(key)
    if mat is None:
        return np.eye(3, dtype=np.float64)
    return np.asarray(mat, dtype=np.float64).reshape(3, 3)


def visible_geometry(results: dict) -> np.ndarray:
    """Homography from the original visible image to ``results['img']``."""
    return homography(results, VISIBLE_KEY)


def infrared_geometry(results: dict) -> np.ndarray:
    """Homography from the original infrared image to
    ``results['ir_img']``."""
    return homography(results, INFRARED_KEY)


def same_geometry(a: np.ndarray, b: np.ndarray, tol: float = 1e-4) -> bool:
    """Whether two homographies map the image the same way (up to ``tol``
    relative to the matrix scale)."""
    if a.shape == b.shape and np.array_equal(a, b):
        return True  # what allclose says of equal values, without its cost
    scale = max(1.0, float(np.abs(a).max()), float(np.abs(b).max()))
    return bool(np.allclose(a, b, rtol=0, atol=tol * scale))


def log_step(results: dict, name: str, moved: str) -> None:
    """Append ``(name, moved)`` to the step log (``moved``: ``'both'``,
    ``'visible'`` or ``'infrared'``)."""
    log = list(results.get(LOG_KEY) or [])
    log.append((name, moved))
    results[LOG_KEY] = log


def record_step(results: dict, name: str, before: np.ndarray) -> None:
    """Record that paired transform ``name`` moved both modalities.

    The infrared geometry is composed with what the step did to the
    visible image (``H_after @ inv(H_before)``): one geometry for both.

    Args:
        results (dict): the results after the visible run (their
            ``homography_matrix`` is the visible geometry after the step).
        name (str): the transform's name, for the step log.
        before (np.ndarray): the visible geometry before the step.
    """
    after = visible_geometry(results)
    moved = not same_geometry(after, before, tol=1e-9)
    if not moved and INFRARED_KEY not in results and \
            VISIBLE_KEY not in results:
        return
    try:
        step = after @ np.linalg.inv(before)
    except np.linalg.LinAlgError:  # a degenerate earlier step (scale 0)
        step = after @ np.linalg.pinv(before)
    results[INFRARED_KEY] = step @ infrared_geometry(results)
    if moved:
        log_step(results, name, BOTH)


def describe_log(results: dict) -> str:
    """The step log as text: ``PairedResize (both) -> RandomFlip
    (visible)``."""
    log: List[Tuple[str, str]] = list(results.get(LOG_KEY) or [])
    if not log:
        return 'no transform recorded a geometric step'
    return ' -> '.join(f'{name} ({moved})' for name, moved in log)


def divergence(results: dict) -> Optional[str]:
    """Why the two modalities' geometries differ, or None when they agree.

    Names the transform that moved one modality only when the step log
    knows it, else the last paired step before the divergence.
    """
    img, ir_img = results.get('img'), results.get('ir_img')
    size_differs = (img is not None and ir_img is not None
                    and img.shape[:2] != ir_img.shape[:2])
    vis_h, ir_h = visible_geometry(results), infrared_geometry(results)
    if not size_differs and same_geometry(vis_h, ir_h):
        return None
    log = list(results.get(LOG_KEY) or [])
    one_sided = [name for name, moved in log if moved != BOTH]
    if one_sided:
        culprit = (f'{one_sided[0]} moved one modality only')
    else:
        paired = [name for name, moved in log if moved == BOTH]
        after = f'after {paired[-1]}' if paired else \
            'before any paired transform'
        culprit = ('a transform that does not record itself in the pair '
                   f'geometry moved one modality ({after})')
    what = []
    if size_differs:
        what.append(f'sizes visible {img.shape[:2]} vs infrared '
                    f'{ir_img.shape[:2]}')
    if not same_geometry(vis_h, ir_h):
        what.append('homographies visible '
                    f'{np.round(vis_h, 3).tolist()} vs infrared '
                    f'{np.round(ir_h, 3).tolist()}')
    return (f'{culprit}; {", ".join(what)}; steps: {describe_log(results)}')


def flipped_copy(old: np.ndarray, new: np.ndarray) -> Optional[str]:
    """``'horizontal'`` / ``'vertical'`` / ``'diagonal'`` when ``new`` is
    exactly ``old`` flipped that way (a geometric change that records
    nothing), else None."""
    if new is old or old.shape != new.shape or old.ndim < 2 or \
            np.array_equal(old, new):
        return None
    for direction, view in (('horizontal', old[:, ::-1]),
                            ('vertical', old[::-1]),
                            ('diagonal', old[::-1, ::-1])):
        if np.array_equal(new, view):
            return direction
    return None

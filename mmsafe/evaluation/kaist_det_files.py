"""Detection files in the formats the KAIST devkit reads and the papers
publish.

- **Combined file** (one for a frame list): ``id,x,y,w,h,score`` per line
  (commas or spaces), ``id`` the 1-based index of the frame in the list's
  frames sorted by name (``set06/V000/I00019`` -> 1 on test-all-20), ``x, y,
  w, h`` in the annotation's pixel coordinates. The devkit's
  ``bbGt('loadAll', annDir, file)`` reads it as is; MLPD, MBNet, MSDS-RCNN
  and others publish their ``*_result.txt`` this way.
- **Per-frame folder**: one file per frame, named ``set06_V000_I00019.txt``
  (or ``set06/V000/I00019.txt``), each line either ``x y w h score`` (the
  devkit's own per-frame format, read as is) or ``person x1 y1 x2 y2
  score`` (the devkit wrapper's format for a detector's 0-based boxes:
  the wrapper turns them into ``x1 + 1, y1 + 1, x2 - x1, y2 - y1``, and so
  does this reader, so such a folder scores as it does there).
"""
import os
import os.path as osp
import re
from typing import Dict, List, Sequence

import numpy as np

from mmsafe.errors import MMSafeFileNotFoundError, MMSafeValueError

_SPLIT = re.compile(r'[,\s]+')


def _numbers(line: str, where: str) -> List[float]:
    try:
        return [float(v) for v in _SPLIT.split(line.strip()) if v]
    except ValueError as err:
        raise MMSafeValueError(
            f'{where}: expected numbers, got {line!r}') from err


def read_combined(path: str, num_frames: int) -> Dict[int, np.ndarray]:
    """A combined file's detections by 0-based frame index.

    Args:
        path (str): the file (``id,x,y,w,h,score`` per line).
        num_frames (int): frames in the list (ids run 1..num_frames).

    Returns:
        dict: frame index -> ``(n, 5)`` float64 ``x, y, w, h, score``.
    """
    rows: Dict[int, list] = {}
    with open(path, encoding='utf-8') as f:
        for num, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f'{path}:{num}'
            values = _numbers(line, where)
            if len(values) != 6:
                raise MMSafeValueError(
                    f'{where}: expected "id,x,y,w,h,score" (6 '
                    f'numbers), got {line.strip()!r}')
            frame = int(values[0])
            if frame != values[0] or not 1 <= frame <= num_frames:
                raise MMSafeValueError(
                    f'{where}: frame id {values[0]:g} is not one of 1..'
                    f'{num_frames} (1-based index of the frame in the list '
                    'sorted by name)')
            rows.setdefault(frame - 1, []).append(values[1:])
    return {k: np.array(v, dtype=np.float64) for k, v in rows.items()}


def read_frame_file(path: str) -> np.ndarray:
    """One per-frame file as ``(n, 5)`` float64 ``x, y, w, h, score``
    (either per-frame format of the module)."""
    rows = []
    with open(path, encoding='utf-8') as f:
        for num, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            where = f'{path}:{num}'
            if re.fullmatch(r'[-+.\deE]+', parts[0]):
                values = _numbers(line, where)
                if len(values) != 5:
                    raise MMSafeValueError(
                        f'{where}: expected "x y w h score" '
                        f'or "person x1 y1 x2 y2 score", got '
                        f'{line.strip()!r}')
                rows.append(values)
                continue
            values = _numbers(' '.join(parts[1:]), where)
            if len(values) != 5:
                raise MMSafeValueError(
                    f'{where}: expected "person x1 y1 x2 y2 '
                    f'score", got {line.strip()!r}')
            x1, y1, x2, y2, score = values
            rows.append([x1 + 1, y1 + 1, x2 - x1, y2 - y1, score])
    return np.array(rows, dtype=np.float64).reshape(-1, 5)


def frame_file(folder: str, frame_id: str) -> str:
    """The per-frame file of ``setNN/VNNN/INNNNN`` in ``folder`` (flat
    ``setNN_VNNN_INNNNN.txt`` first, else nested), '' when neither
    exists."""
    for name in (frame_id.replace('/', '_') + '.txt', frame_id + '.txt'):
        path = osp.join(folder, name)
        if osp.isfile(path):
            return path
    return ''


def missing_frame_files(folder: str, frame_ids: Sequence[str]) -> List[str]:
    """The frames of ``frame_ids`` without a file in a per-frame folder."""
    return [f for f in frame_ids if not frame_file(folder, f)]


def read_detections(path: str,
                    frame_ids: Sequence[str]) -> Dict[str, np.ndarray]:
    """The detections of each frame from a combined file or a per-frame
    folder.

    Args:
        path (str): a combined file or a per-frame folder.
        frame_ids (Sequence[str]): the evaluated frames
            (``setNN/VNNN/INNNNN``).

    Returns:
        dict: frame id -> ``(n, 5)`` ``x, y, w, h, score`` (frames without
        detections map to an empty array).
    """
    ordered = sorted(frame_ids)
    empty = np.zeros((0, 5), dtype=np.float64)
    if osp.isdir(path):
        out = {}
        for frame in ordered:
            found = frame_file(path, frame)
            out[frame] = read_frame_file(found) if found else empty
        return out
    if not osp.isfile(path):
        raise MMSafeFileNotFoundError(f'detections {path!r}: no such file or '
                                      'folder')
    by_index = read_combined(path, len(ordered))
    return {frame: by_index.get(i, empty) for i, frame in enumerate(ordered)}


def write_combined(path: str, dets: Sequence[np.ndarray]) -> None:
    """Write frames' ``x, y, w, h, score`` rows as a combined file, frame
    ``i`` (0-based, in the order given) as id ``i + 1``."""
    folder = osp.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
        for index, rows in enumerate(dets, 1):
            for x, y, w, h, score in np.asarray(rows).reshape(-1, 5):
                f.write(f'{index},{x:.4f},{y:.4f},{w:.4f},{h:.4f},'
                        f'{score:.10g}\n')

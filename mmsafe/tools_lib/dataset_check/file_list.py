"""``tools/check_dataset.py --files``: check only the samples a run named.

Training names the images of every skipped optimizer step (NaN, fp16
overflow, gradient spike) in ``{work_dir}/mmsafe_events.jsonl``, the
repeated offenders in ``safety_report.json`` and the samples a rollback
moved past in ``rollback_<n>_files.txt``. Each of these files (or a text
file with one path per line) selects the samples to audit: a sample is
selected when its visible or infrared path ends with a listed path, so
relative and absolute spellings of the same file match.
"""
import json
import os.path as osp
from typing import Iterable, List, Sequence, Tuple

from mmsafe.datasets.walk import resolve_index
from mmsafe.errors import MMSafeValueError

#: event kinds whose ``files`` name images
_EVENT_KINDS = ('step_skip', 'rollback')


def _split_pair(entry: str) -> List[str]:
    """``'visible | infrared'`` (how mmsafe logs a pair) -> both paths."""
    return [p.strip() for p in str(entry).split(' | ') if p.strip()]


def read_file_list(path: str) -> List[str]:
    """The image paths a file names.

    Args:
        path (str): ``mmsafe_events.jsonl`` (the images of ``step_skip``
            and ``rollback`` events), ``safety_report.json`` (its
            ``repeated_offenders``), or a text file with one path (or
            ``visible | infrared`` pair) per line; ``#`` starts a comment.

    Returns:
        list[str]: the paths, in order, without repeats.

    Raises:
        ValueError: the file names no image.
    """
    with open(path, encoding='utf-8') as f:
        text = f.read()
    entries: List[str] = []
    if path.endswith('.jsonl'):
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a killed writer
            if isinstance(record, dict) and \
                    record.get('kind') in _EVENT_KINDS:
                entries += [str(f) for f in record.get('files') or []]
    elif path.endswith('.json'):
        report = json.loads(text)
        entries = [o['file'] for o in report.get('repeated_offenders') or []]
    else:
        entries = [line.split('#', 1)[0].strip()
                   for line in text.splitlines()]
    paths = [p for entry in entries if entry for p in _split_pair(entry)]
    paths = list(dict.fromkeys(paths))
    if not paths:
        raise MMSafeValueError(f'--files {path}: no image path in it')
    return paths


def _matches(path: str, wanted: Sequence[str]) -> bool:
    norm = osp.normpath(path)
    return any(norm == w or norm.endswith(osp.sep + w) for w in wanted)


def select_indices(dataset, paths: Iterable[str]
                   ) -> Tuple[List[int], List[str]]:
    """The dataset indices whose visible or infrared image is listed.

    Args:
        dataset: the built dataset (wrappers are looked through).
        paths (Iterable[str]): image paths (:func:`read_file_list`).

    Returns:
        tuple[list[int], list[str]]: the selected indices, and the listed
        paths that no sample of the dataset has.
    """
    wanted = [osp.normpath(p) for p in paths]
    found, hit = [], set()
    for index in range(len(dataset)):
        owner, local = resolve_index(dataset, index)
        info = owner.get_data_info(local)
        own = [p for p in (info.get('img_path'), info.get('ir_img_path'))
               if p]
        matched = [w for w in wanted if any(_matches(p, [w]) for p in own)]
        if matched:
            found.append(index)
            hit.update(matched)
    return found, [p for p, w in zip(paths, wanted) if w not in hit]

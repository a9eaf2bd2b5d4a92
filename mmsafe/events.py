"""Shared event reporting for mmsafe guards.

Every guard reports what it did in three places:

* a log line through MMEngine's current logger, prefixed ``[mmsafe]``;
* a JSON line appended to ``{work_dir}/mmsafe_events.jsonl`` (one file per
  run, each record carries its rank, so ranks never interleave partial
  lines: each write is a single ``write`` of one line in append mode);
* counters in the runner's message hub under ``mmsafe/<guard>`` so that
  ``SafetyReportHook`` and the logger can pick them up;
* and, for values worth a curve, ``train/*`` scalars in the message hub.

Every event kind, counter key and scalar is declared by the guard that
emits it (its ``guard_outputs``, :mod:`mmsafe.guard_outputs`); these
functions refuse one that no guard declares.
"""
import json
import logging
import os
import os.path as osp
import time
from typing import Any, Dict, Optional

from mmsafe.guard_outputs import owner_of
from mmsafe.modalities import sample_files

EVENTS_FILE = 'mmsafe_events.jsonl'
INFO_PREFIX = 'mmsafe/'


def _rank() -> int:
    from mmengine.dist import get_rank
    return get_rank()


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: tensors and numbers as Python
    numbers, NaN/Inf as strings, anything else as its ``str``."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, 'item') and getattr(value, 'numel', lambda: 2)() == 1:
        value = value.item()
    if isinstance(value, float) and (value != value or value in
                                     (float('inf'), float('-inf'))):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def write_event(work_dir: Optional[str], kind: str, **fields: Any) -> Dict:
    """Append one event record to the run's JSONL event log.

    Args:
        work_dir (str, optional): the runner's work dir; nothing is written
            when it is None.
        kind (str): event type, one of :class:`mmsafe.guard_outputs.Event`
            (or one a plugin's guard declares on its class).
        **fields: JSON-serialisable details (tensors and numbers are
            converted; NaN/Inf become strings).

    Returns:
        dict: the record that was written.

    Raises:
        mmsafe.guard_outputs.UndeclaredOutputError: ``kind`` is not
            declared.
    """
    owner_of('events', kind)
    record = dict(time=time.time(), rank=_rank(), kind=kind)
    record.update(jsonable(fields))
    if work_dir:
        os.makedirs(work_dir, exist_ok=True)
        line = json.dumps(record, sort_keys=True) + '\n'
        with open(osp.join(work_dir, EVENTS_FILE), 'a', encoding='utf-8') as f:
            f.write(line)
    return record


def read_events(work_dir: str, kind: Optional[str] = None) -> list:
    """Read the records of ``{work_dir}/mmsafe_events.jsonl``."""
    path = osp.join(work_dir, EVENTS_FILE)
    if not osp.exists(path):
        return []
    with open(path, encoding='utf-8') as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if kind is None or r.get('kind') == kind]


def log(message: str, level: int = logging.INFO) -> None:
    """Log through MMEngine's current logger with the ``[mmsafe]`` prefix."""
    from mmengine.logging import print_log
    print_log(f'[mmsafe] {message}', logger='current', level=level)


def log_once(key: str, message: str, level: int = logging.WARNING,
             _seen: set = set()) -> None:  # noqa: B006 (process-wide memo)
    """:func:`log` ``message`` the first time ``key`` is seen in this
    process; later calls with the same key log nothing."""
    if key in _seen:
        return
    _seen.add(key)
    log(message, level)


def update_counters(guard: str, **counts: Any) -> None:
    """Publish a guard's counters in the message hub as ``mmsafe/<guard>``
    (``guard``: one of :class:`mmsafe.guard_outputs.CounterKey`)."""
    owner_of('counters', guard)
    from mmengine.logging import MessageHub
    hub = MessageHub.get_current_instance()
    key = INFO_PREFIX + guard
    current = dict(hub.runtime_info.get(key, {}) or {})
    current.update(jsonable(counts))
    hub.update_info(key, current)


def update_scalar(message_hub, name: str, value: Any) -> None:
    """Publish the ``train/*`` scalar ``name`` (one of
    :class:`mmsafe.guard_outputs.Scalar`) in ``message_hub``, where
    MMEngine's logger and visualizer backends read it."""
    owner_of('scalars', name)
    message_hub.update_scalar(name, value)


def batch_file_names(data_batch: Any, limit: int = 16) -> list:
    """Image paths (visible and infrared) of a data batch, for log lines:
    ``'visible | infrared'`` per sample, by the meta keys the run declares
    (:func:`mmsafe.modalities.sample_files`)."""
    names = []
    samples = data_batch.get('data_samples', []) if isinstance(
        data_batch, dict) else []
    for sample in samples or []:
        meta = getattr(sample, 'metainfo', {}) or {}
        path, ir_path = sample_files(meta)
        if path is not None or ir_path is not None:
            names.append(path if ir_path is None else f'{path} | {ir_path}')
        if len(names) >= limit:
            break
    return names

"""How a guard of mmsafe reports: one function per output.

* :func:`write_event`: an event, the one way to say that something
  happened. Its record goes to ``{work_dir}/mmsafe_events.jsonl`` (one file
  per run, each record carries its rank, so ranks never interleave partial
  lines: each write is a single ``write`` of one line in append mode),
  which ``SafetyReportHook`` counts under the section of the guard that
  declares the kind; its message, when it has one, is logged through
  MMEngine's current logger, prefixed ``[mmsafe]``, and reaches rank 0's
  log under DDP (:mod:`mmsafe.engine.rank_channel` forwards it);
* :func:`update_counters`: counters in the runner's message hub under
  ``mmsafe/<key>``, gathered from every rank by ``SafetyReportHook``;
* :func:`update_scalar`: ``train/*`` scalars in the message hub, for a
  curve in MMEngine's logger and visualizer backends;
* :func:`log`: a log line that is no event.

Every event kind, counter key and scalar is declared by the guard that
emits it (its ``guard_outputs``, :mod:`mmsafe.guard_outputs`);
tests/test_guard_outputs.py checks the names, nothing is checked at run
time.
"""
import json
import logging
import os
import os.path as osp
import time
from typing import Any, Dict, Optional

from mmsafe.modalities import sample_files

EVENTS_FILE = 'mmsafe_events.jsonl'
INFO_PREFIX = 'mmsafe/'
LOG_PREFIX = '[mmsafe] '

#: The attribute of the log record of an event's message that holds the
#: event's kind (with its ``problem`` field, when the record has one): by
#: it, the rank channel knows which log records to forward to rank 0.
EVENT_ATTR = 'mmsafe_event'


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


def write_event(work_dir: Optional[str], kind: str,
                message: Optional[str] = None, level: int = logging.WARNING,
                /, **fields: Any) -> Dict:
    """Emit one event: append its record to the run's JSONL event log and,
    with a ``message``, log it on this rank and on rank 0.

    Under DDP a message of a rank other than 0 reaches rank 0's console and
    log as ``[from rank R] message`` when the run has a rank channel
    (SafeRunner's); repeats of one kind (and one ``problem``, for a record
    that names one) are forwarded at their 1st, 2nd, 4th, 8th, ...
    occurrence on that rank. Nothing waits for another rank.

    Args:
        work_dir (str, optional): the runner's work dir; no record is
            written when it is None.
        kind (str): the event's kind, declared by the emitting guard
            (``Event.X`` of :mod:`mmsafe.guard_outputs`, or a plugin's
            string).
        message (str, optional): what happened, for the log (without the
            ``[mmsafe]`` prefix); None logs nothing.
        level (int): the message's logging level.
        **fields: JSON-serialisable details (tensors and numbers are
            converted; NaN/Inf become strings). The arguments above are
            positional only, so a field may be called ``message`` or
            ``level``.

    Returns:
        dict: the record (``time``, ``rank``, ``kind`` and the fields).
    """
    record = dict(time=time.time(), rank=_rank(), kind=kind)
    record.update(jsonable(fields))
    if work_dir:
        os.makedirs(work_dir, exist_ok=True)
        line = json.dumps(record, sort_keys=True) + '\n'
        with open(osp.join(work_dir, EVENTS_FILE), 'a', encoding='utf-8') as f:
            f.write(line)
    if message is not None:
        from mmengine.logging import MMLogger
        problem = fields.get('problem')
        shared = kind if problem is None else f'{kind}/{problem}'
        MMLogger.get_current_instance().log(
            level, LOG_PREFIX + message,
            extra={EVENT_ATTR: shared, 'mmsafe_iter': fields.get('iter')})
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
    print_log(LOG_PREFIX + message, logger='current', level=level)


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
    (``guard``: a counter key the guard declares, ``CounterKey.X``), merged
    into the dict already there."""
    from mmengine.logging import MessageHub
    hub = MessageHub.get_current_instance()
    key = INFO_PREFIX + guard
    current = dict(hub.runtime_info.get(key, {}) or {})
    current.update(jsonable(counts))
    hub.update_info(key, current)


def update_scalar(message_hub, name: str, value: Any) -> None:
    """Publish the ``train/*`` scalar ``name`` (declared by the guard,
    ``Scalar.X``) in ``message_hub``, where MMEngine's logger and
    visualizer backends read it."""
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

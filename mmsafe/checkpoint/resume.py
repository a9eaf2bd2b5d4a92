"""Auto-resume from the newest checkpoint that really loads.

:func:`find_latest_loadable_checkpoint` is what
:class:`~mmsafe.engine.runner.SafeRunner` resumes from with
``resume=True`` and no ``load_from``: the checkpoint named in
``{work_dir}/last_checkpoint`` when it loads, otherwise the newest other
loadable ``*.pth`` of its folder, skipping a corrupt or truncated one with a
warning and an event. :func:`record_resume` counts resumes in the message
hub (``mmsafe/resume``) and as events (``kind='resume'``).
"""
import glob
import logging
import os.path as osp
from typing import Any, List, Optional, Tuple

from mmengine.dist import is_main_process

from mmsafe.errors import MMSafeRuntimeError
from mmsafe.events import INFO_PREFIX, log, update_counters, write_event
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from .container import CheckpointArchive
from .errors import CheckpointFormatError, UntrustedCheckpointError
from .loader import load_checkpoint_file

guard_outputs = GuardOutputs(
    Section.RESUMES,
    events=(Event.RESUME, Event.RESUME_SKIPPED_CHECKPOINT),
    counters=(CounterKey.RESUME, ))


# --------------------------------------------------------------------------
def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be resumed from, or None when it loads.

    Every record of the container is CRC-checked, then the checkpoint is
    loaded with mmsafe's loader (memory-mapped, so tensors are not read
    twice). A file that is not a plain ``torch.save`` archive (a
    TorchScript, tar or legacy file) or is damaged is a reason to skip it
    (:class:`~.errors.CheckpointFormatError`).

    Raises:
        UntrustedCheckpointError: the file holds an object that is not
            plain data; that is a decision for the user, never a reason to
            skip silently.
    """
    if not osp.exists(path):
        return 'file does not exist'
    try:
        with CheckpointArchive(path, path) as archive:
            archive.verify()
        ckpt = load_checkpoint_file(path, map_location='cpu', mmap=True)
    except UntrustedCheckpointError:
        raise
    except CheckpointFormatError as err:
        return f'{type(err).__name__}: {err}'
    except Exception as err:  # any failure to read means: do not use it
        return f'{type(err).__name__}: {str(err).splitlines()[0][:200]}'
    # Runner.resume reads these three; a published model lacks the hub.
    missing = [key for key in ('meta', 'state_dict', 'message_hub')
               if not isinstance(ckpt, dict) or key not in ckpt]
    if missing:
        return f'not a resumable training checkpoint (no {missing})'
    return None


def checkpoint_meta(path: str) -> dict:
    """The ``meta`` of the checkpoint at ``path`` (mmsafe's loader,
    memory-mapped: the tensors are not read); ``{}`` when it has none."""
    ckpt = load_checkpoint_file(path, map_location='cpu', mmap=True)
    meta = ckpt.get('meta') if isinstance(ckpt, dict) else None
    return meta if isinstance(meta, dict) else {}


def _resumable_candidates(directory: str) -> List[str]:
    paths = [p for p in glob.glob(osp.join(directory, '*.pth'))
             if osp.isfile(p)]
    return sorted(paths, key=osp.getmtime, reverse=True)


def find_latest_loadable_checkpoint(path: str) -> Optional[str]:
    """Auto-resume target: the checkpoint named in ``last_checkpoint`` when
    it loads, otherwise the newest other ``*.pth`` next to it that loads.

    Args:
        path (str): the work dir.

    Returns:
        str or None: None when the work dir has no checkpoint at all.

    Raises:
        RuntimeError: checkpoints exist but none of them loads.
    """
    pointer_file = osp.join(path, 'last_checkpoint')
    pointed = None
    if osp.exists(pointer_file):
        with open(pointer_file) as f:
            pointed = f.read().strip() or None
    if pointed is not None and '://' in pointed:
        return pointed  # remote storage: MMEngine loads it as before
    directory = osp.dirname(pointed) if pointed else path
    candidates = ([pointed] if pointed else []) + [
        p for p in _resumable_candidates(directory) if p != pointed]
    if not candidates:
        log('Did not find last_checkpoint to be resumed.', logging.INFO)
        return None
    if pointed is None:
        log(f'{pointer_file} is missing or empty; looking for the newest '
             f'loadable checkpoint in {directory}.', logging.WARNING)
    skipped = []
    for candidate in candidates:
        problem = checkpoint_problem(candidate)
        if problem is None:
            if skipped:
                _report_skipped(path, skipped, candidate)
            return candidate
        skipped.append((candidate, problem))
    raise MMSafeRuntimeError(
        '[mmsafe] Cannot resume: no checkpoint in '
        f'{directory} loads: ' + '; '.join(f'{p}: {why}'
                                                 for p, why in skipped))


def _report_skipped(work_dir: str, skipped: List[Tuple[str, str]],
                    chosen: str) -> None:
    for path, problem in skipped:
        log(f'Skipping checkpoint {path} for auto-resume: it does not load '
             f'({problem}). Resuming from {chosen} instead.',
             logging.WARNING)
        if is_main_process():
            write_event(work_dir, Event.RESUME_SKIPPED_CHECKPOINT,
                        checkpoint=path, problem=problem, chosen=chosen)


def record_resume(runner: Any, filename: str) -> None:
    # The message hub was just restored from the checkpoint, so the count
    # carries over from earlier resumes of the same run.
    previous = runner.message_hub.runtime_info.get(
        INFO_PREFIX + CounterKey.RESUME, {}) or {}
    count = int(previous.get('count', 0)) + 1
    update_counters(CounterKey.RESUME, count=count, last_checkpoint=filename,
                    last_iter=runner.iter, last_epoch=runner.epoch)
    if is_main_process():
        write_event(runner.work_dir, Event.RESUME, checkpoint=filename,
                    iter=runner.iter, epoch=runner.epoch, count=count)
    log(f'Resumed from {filename} at epoch {runner.epoch}, iteration '
         f'{runner.iter} (resume #{count} of this run).', logging.INFO)

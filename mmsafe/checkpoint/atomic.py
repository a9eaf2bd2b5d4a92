"""Atomic checkpoint writes: a file is either complete or absent.

:class:`AtomicLocalBackend` is a local file backend registered in MMEngine
as ``'atomic_local'`` (``mmengine.fileio.register_backend``). It writes a
temporary file in the same folder, flushes and fsyncs it, renames it over
the target (``os.replace``) and fsyncs the folder. ``remove`` of a
checkpoint waits until the next checkpoint of the same folder is complete,
so that ``CheckpointHook(max_keep_ckpts=N)``, which removes the oldest
checkpoint before it saves the new one, never leaves fewer than N complete
checkpoints. :class:`~mmsafe.engine.runner.SafeRunner` saves local
checkpoints through it.
"""
import contextlib
import glob
import os
import os.path as osp
import re
import threading
from typing import Any, Callable, Dict, List, Union

from mmengine.fileio import LocalBackend, register_backend

from mmsafe.events import log

TMP_SUFFIX = '.mmsafe-tmp'

#: ``backend_args`` that select :class:`AtomicLocalBackend`.
ATOMIC_BACKEND_ARGS = dict(backend='atomic_local')


# --------------------------------------------------------------------------
def _fsync_dir(dirname: str) -> None:
    # Makes the rename itself durable; not possible on Windows.
    if os.name != 'posix':
        return
    fd = os.open(dirname, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tmp_path(filename: str) -> str:
    dirname, base = osp.split(osp.abspath(filename))
    # The thread too: a crash report may be written by a listener thread
    # while the main thread writes its own.
    return osp.join(dirname, f'.{base}.t{threading.get_ident()}.'
                    f'{os.getpid()}{TMP_SUFFIX}')


def _remove_stale_tmp_files(dirname: str) -> None:
    """Remove temporary files left by a save whose process was killed."""
    for path in glob.glob(osp.join(dirname, f'.*{TMP_SUFFIX}')):
        match = re.search(r'\.(\d+)' + re.escape(TMP_SUFFIX) + '$', path)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        # On Windows os.kill would terminate the process; there a file that
        # another process still writes cannot be removed anyway.
        if os.name == 'posix':
            try:
                os.kill(int(match.group(1)), 0)
                continue  # its writer is still alive
            except ProcessLookupError:
                pass
            except OSError:
                continue
        with contextlib.suppress(OSError):
            os.remove(path)
            log(f'removed {path}, left by an interrupted checkpoint save.')


def atomic_write(filename: str, write: Callable[[Any], None],
                 mode: str = 'wb') -> None:
    """Write ``filename`` so that it is either complete or absent/unchanged.

    Args:
        filename (str): the final path.
        write (Callable): called with the open temporary file.
        mode (str): ``'wb'`` or ``'w'``.
    """
    filename = osp.abspath(filename)
    dirname = osp.dirname(filename)
    os.makedirs(dirname, exist_ok=True)
    tmp = _tmp_path(filename)
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, filename)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(dirname)


def is_local_path(path: Any, backend_args: Any = None) -> bool:
    """Whether MMEngine would write ``path`` through its local backend."""
    if not isinstance(path, str) or '://' in path:
        return False
    from mmengine.fileio import get_file_backend
    return type(get_file_backend(path, backend_args=backend_args)) is \
        LocalBackend


def _is_checkpoint(path: str) -> bool:
    return str(path).endswith('.pth')


@register_backend('atomic_local')
class AtomicLocalBackend(LocalBackend):
    """:class:`mmengine.fileio.LocalBackend` whose writes are atomic and
    whose removal of a checkpoint waits for the next complete checkpoint.

    The pending removals are shared by every instance (MMEngine builds one
    backend in ``CheckpointHook`` and another in ``save_checkpoint``) and
    keyed by folder: a ``put`` of a ``.pth`` file completes them for its
    folder.
    """

    _pending_removals: Dict[str, List[str]] = {}

    def put(self, obj: bytes, filepath: Union[str, os.PathLike]) -> None:
        filepath = str(filepath)
        atomic_write(filepath, lambda f: f.write(obj))
        _remove_stale_tmp_files(osp.dirname(osp.abspath(filepath)))
        if _is_checkpoint(filepath):
            folder = osp.dirname(osp.abspath(filepath))
            for path in self._pending_removals.pop(folder, []):
                if osp.abspath(path) != osp.abspath(filepath):
                    super().remove(path)

    def put_text(self, obj: str, filepath: Union[str, os.PathLike],
                 encoding: str = 'utf-8') -> None:
        atomic_write(str(filepath), lambda f: f.write(obj.encode(encoding)))

    def remove(self, filepath: Union[str, os.PathLike]) -> None:
        filepath = str(filepath)
        if not _is_checkpoint(filepath):
            return super().remove(filepath)
        folder = osp.dirname(osp.abspath(filepath))
        self._pending_removals.setdefault(folder, []).append(filepath)


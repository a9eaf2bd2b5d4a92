"""Stacks of the threads of this process, read from another thread."""
import os.path as osp
import sys
import threading
import traceback
from types import FrameType
from typing import Optional

# Module of torch.distributed's public collectives.
_C10D = osp.join('torch', 'distributed', 'distributed_c10d.py')


def all_stacks() -> str:
    """Every thread's stack except the caller's, main thread first."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    parts = []
    for ident in sorted(frames, key=lambda ident: ident != main):
        if ident == me:
            continue
        stack = ''.join(traceback.format_stack(frames[ident]))
        parts.append(f'--- thread {names.get(ident, "?")} '
                     f'(id {ident}) ---\n{stack}')
    return '\n'.join(parts)


def main_frame() -> Optional[FrameType]:
    """The innermost Python frame of the main thread."""
    return sys._current_frames().get(threading.main_thread().ident)


def describe(frame: Optional[FrameType]) -> str:
    """``function (file:line)`` of a frame."""
    if frame is None:
        return '?'
    code = frame.f_code
    return f'{code.co_name} ({code.co_filename}:{frame.f_lineno})'


def collective_of(frame: Optional[FrameType]) -> Optional[str]:
    """Name of the ``torch.distributed`` collective that ``frame``'s thread
    is inside (the outermost one: the function its caller called, e.g.
    ``all_gather_object`` rather than the ``all_gather`` inside it), or
    None. A collective waiting in native code (DDP's gradient all-reduce
    during backward) has no Python frame and is not seen here."""
    name = None
    while frame is not None:
        if frame.f_code.co_filename.endswith(_C10D):
            name = frame.f_code.co_name
        frame = frame.f_back
    return name

"""Let a process keep the memory it frees, for its next images.

A decoded 1280x1024 colour image is 3.9 MB, a 640x512 one 0.98 MB, and a
data pipeline allocates and frees several such buffers per sample (the
decode, the resize, the packed ``C x H x W`` copy). glibc's ``malloc``
serves blocks above its mmap threshold (128 KiB at start, raised by
itself up to 32 MiB as such blocks are freed) with fresh mappings, and
gives the top of its heap back to the kernel as soon as more than its trim
threshold (twice the mmap threshold) is free there. Either way the next
sample's buffers are new zero-filled pages, each faulted in on first write
(on a virtual machine about 2.5 us per 4 KiB page: ~2,000 faults per pair
of 1280x1024 images, ~1,000 per pair decoded at 1/2 with OpenCV 4.x).

:func:`keep_freed_memory` fixes both thresholds (``mallopt``), so that
freed buffers stay in the heap and are reused: the process's peak memory
is unchanged (it only keeps what it already had), its resident size no
longer shrinks below that peak by more than the trim threshold.

Only glibc (Linux) has these settings; elsewhere :func:`unavailable` says
why and nothing changes. Memory settings change no computed value.
"""
import ctypes
import ctypes.util
import os
import sys
from typing import Callable, Optional

from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError

#: ``mallopt`` parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: glibc refuses an mmap threshold above HEAP_MAX / 2 = 32 MiB on 64-bit
MAX_MMAP_THRESHOLD_MB = 32


def _glibc_version() -> Optional[str]:
    try:
        return os.confstr('CS_GNU_LIBC_VERSION')
    except (AttributeError, ValueError, OSError):
        return None


def _find_mallopt() -> Optional[Callable[[int, int], int]]:
    """glibc's ``mallopt`` of this process, or None."""
    if _glibc_version() is None:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    # int mallopt(int param, int value): ctypes' default int return
    return lambda param, value: fn(ctypes.c_int(param), ctypes.c_int(value))


def unavailable() -> Optional[str]:
    """Why this process cannot keep freed memory, or None when it can."""
    if _glibc_version() is None:
        return (f'this platform ({sys.platform}) has no glibc allocator '
                'whose thresholds can be set')
    if _find_mallopt() is None:
        return f'{_glibc_version()} has no mallopt'
    return None


def check_thresholds(trim_threshold_mb: float,
                     mmap_threshold_mb: float) -> None:
    """Raise ``ValueError`` for thresholds that ``mallopt`` refuses or that
    would not keep an image's buffers."""
    if not 0 < mmap_threshold_mb <= MAX_MMAP_THRESHOLD_MB:
        raise MMSafeValueError(
            f'mmap_threshold_mb must be in (0, {MAX_MMAP_THRESHOLD_MB}] '
            f'(glibc\'s limit), got {mmap_threshold_mb}')
    if trim_threshold_mb < mmap_threshold_mb:
        raise MMSafeValueError(
            f'trim_threshold_mb ({trim_threshold_mb}) must be at least '
            f'mmap_threshold_mb ({mmap_threshold_mb}): a block served from '
            'the heap and freed would be given back at once')
    if trim_threshold_mb * 2**20 >= 2**31:
        raise MMSafeValueError(
            f'trim_threshold_mb must be below 2048 MiB, got '
            f'{trim_threshold_mb}')


def keep_freed_memory(trim_threshold_mb: float = 128,
                      mmap_threshold_mb: float = 32) -> None:
    """Make this process serve blocks up to ``mmap_threshold_mb`` from its
    heap and keep up to ``trim_threshold_mb`` of freed memory at the heap's
    top instead of giving it back to the kernel.

    Processes forked afterwards (DataLoader workers under ``fork``) inherit
    the setting; spawn-started ones need their own call.

    Raises:
        RuntimeError: the platform has no such setting (see
            :func:`unavailable`) or ``mallopt`` refused a value.
    """
    check_thresholds(trim_threshold_mb, mmap_threshold_mb)
    fn = _find_mallopt()
    if fn is None:
        raise MMSafeRuntimeError(f'cannot keep freed memory: {unavailable()}')
    for name, param, mb in (('M_MMAP_THRESHOLD', M_MMAP_THRESHOLD,
                             mmap_threshold_mb),
                            ('M_TRIM_THRESHOLD', M_TRIM_THRESHOLD,
                             trim_threshold_mb)):
        if fn(param, int(mb * 2**20)) != 1:
            raise MMSafeRuntimeError(f'mallopt({name}, {int(mb * 2**20)}) was '
                                     f'refused by {_glibc_version()}')

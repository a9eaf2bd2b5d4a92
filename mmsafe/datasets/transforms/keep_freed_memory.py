"""A pipeline step that lets the processes running the pipeline reuse the
memory they free (see :mod:`mmsafe.datasets.loader.allocator`)."""
import logging
import os

from mmcv.transforms import BaseTransform

from mmsafe.registry import TRANSFORMS
from mmsafe.datasets.loader.allocator import (check_thresholds,
                                              keep_freed_memory, unavailable)
from mmsafe.events import log_once

#: (trim, mmap) thresholds -> pid of the process that applied them last
_APPLIED = {}


@TRANSFORMS.register_module()
class KeepFreedMemory(BaseTransform):
    """Make every process that runs this pipeline keep the memory it frees
    for its next samples: DataLoader workers (fork or spawn started, the
    probe's too) and the main process when it loads (``num_workers=0``).

    Without it, glibc gives an image's buffers back to the kernel when they
    are freed, and the next sample faults fresh pages in for its decode,
    resize and packing (~2,000 page faults per pair of 1280x1024 images,
    ~1,000 per pair decoded at 1/2 with OpenCV 4.x; a third of a worker's
    time on a virtual machine, ``benchmarks/README.md``). With it, the process's peak memory is what
    it was; it stops shrinking back by more than ``trim_threshold_mb``.

    It acts once per process, on that process's first sample, through
    glibc's ``mallopt`` (:func:`~mmsafe.datasets.loader.allocator.
    keep_freed_memory`), and returns the sample unchanged: the pipeline's
    output, random draws included, is what it is without this step. Its
    place in the pipeline does not matter; put it last so that
    ``pipeline[0]`` stays the loader. Where glibc is absent (Windows,
    macOS) it says so once when built and changes nothing.

    Args:
        trim_threshold_mb (float): freed memory (MiB) a process may keep at
            the top of its heap. Defaults to 128.
        mmap_threshold_mb (float): blocks up to this size (MiB, at most 32)
            come from the heap instead of their own mapping. Defaults to
            32.
    """

    def __init__(self, trim_threshold_mb: float = 128,
                 mmap_threshold_mb: float = 32) -> None:
        check_thresholds(trim_threshold_mb, mmap_threshold_mb)
        self.trim_threshold_mb = trim_threshold_mb
        self.mmap_threshold_mb = mmap_threshold_mb
        reason = unavailable()
        if reason is None:
            log_once(
                f'KeepFreedMemory{self._key}',
                f'KeepFreedMemory: each process that runs this pipeline '
                f'keeps up to {trim_threshold_mb} MiB of the memory it '
                'frees for its next samples (blocks up to '
                f'{mmap_threshold_mb} MiB from the heap); remove '
                'KeepFreedMemory from the pipeline to turn it off',
                logging.INFO)
        else:
            log_once(
                'KeepFreedMemory/unavailable',
                f'KeepFreedMemory does nothing here: {reason}; the pipeline '
                'runs with the allocator as it is (remove KeepFreedMemory '
                'from the pipeline to drop this message)')

    @property
    def _key(self) -> tuple:
        return (self.trim_threshold_mb, self.mmap_threshold_mb)

    def transform(self, results):
        """Return ``results`` as they are, after setting this process's
        allocator on its first call."""
        pid = os.getpid()
        if _APPLIED.get(self._key) != pid:
            _APPLIED[self._key] = pid
            if unavailable() is None:
                keep_freed_memory(self.trim_threshold_mb,
                                  self.mmap_threshold_mb)
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(trim_threshold_mb='
                f'{self.trim_threshold_mb}, mmap_threshold_mb='
                f'{self.mmap_threshold_mb})')

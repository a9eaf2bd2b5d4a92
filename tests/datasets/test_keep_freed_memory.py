"""``KeepFreedMemory``: a loading process reuses the memory it frees.

The fault: glibc gives an image's buffers back to the kernel when they are
freed, so each pair of the LLVIP recipe's train pipeline decoding its
1280x1024 JPEGs at full size faults ~1,950 fresh pages in (at 1/2, ~1,000
with OpenCV 4.x). With the recipe's
``KeepFreedMemory`` step the process that runs the pipeline (main process,
fork- or spawn-started DataLoader worker) stops doing so, and its samples
are those of the pipeline without the step. Measured in fresh processes:
the setting is process-wide and cannot be undone.

The training runs with and without the step are compared weight for weight
in tests/engine/test_healthy_identity.py.
"""
import json
import sys

import pytest

from mmsafe.datasets import ensure_synthetic_llvip
from mmsafe.datasets.loader import allocator
from tests.utils import logged_messages, run_command

SYNTH = dict(num_train=2, num_test=1, img_size=(1280, 1024), seed=0,
             max_people=4, empty_ratio=0.0, person_height=(60, 500))
#: an image's buffers faulted in anew: ~1,950 faults per pair
FAULTING = 400
#: reused: next to none (a few pages of Python objects)
REUSED = 60


@pytest.fixture(scope='module')
def jpeg_pairs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('keep') / 'llvip') + '/'
    return ensure_synthetic_llvip(root, **SYNTH)


def _child(root: str, where: str) -> dict:
    result = run_command(
        [sys.executable, '-m', 'tests.datasets.memory_toys', root, where],
        timeout=240)
    assert result.returncode == 0 and not result.timed_out, result
    # stdout and stderr come merged: a warning the interpreter prints at
    # exit (multiprocessing's resource tracker, under spawn) may follow
    # the one JSON line the child prints
    lines = [line for line in result.output.splitlines()
             if line.startswith('{')]
    assert len(lines) == 1, result
    return json.loads(lines[0])


@pytest.mark.skipif(allocator.unavailable() is not None,
                    reason='needs glibc')
def test_pipeline_process_reuses_freed_memory(jpeg_pairs):
    result = _child(jpeg_pairs, 'process')
    assert result['without'] > FAULTING, result
    assert result['with'] < REUSED, result
    # the samples (images, boxes, meta, flip draws) are the same
    assert result['same_samples'] is True, result


@pytest.mark.skipif(allocator.unavailable() is not None,
                    reason='needs glibc')
@pytest.mark.parametrize('context', ['fork', 'spawn'])
def test_dataloader_worker_reuses_freed_memory(jpeg_pairs, context):
    result = _child(jpeg_pairs, context)
    # each loader's pipeline ran in its own worker, not in the main process
    for key in ('without_pids', 'with_pids'):
        assert len(result[key]) == 1, result
        assert result[key][0] != result['main_pid'], result
    assert result['without'] > FAULTING, result
    assert result['with'] < REUSED, result


def test_thresholds_are_checked_when_built():
    from mmdet.registry import TRANSFORMS
    with pytest.raises(ValueError, match='at most|glibc'):
        TRANSFORMS.build(dict(type='KeepFreedMemory', mmap_threshold_mb=64))
    with pytest.raises(ValueError, match='at least mmap_threshold_mb'):
        TRANSFORMS.build(dict(type='KeepFreedMemory', trim_threshold_mb=16,
                              mmap_threshold_mb=32))


def test_without_glibc_it_says_so_and_changes_nothing(monkeypatch):
    from mmdet.registry import TRANSFORMS
    from mmsafe.datasets.transforms import keep_freed_memory as memory
    monkeypatch.setattr(allocator, '_glibc_version', lambda: None)

    def no_mallopt(*args):
        raise AssertionError('mallopt called without glibc')

    monkeypatch.setattr(memory, 'keep_freed_memory', no_mallopt)
    with logged_messages() as messages:
        step = TRANSFORMS.build(dict(type='KeepFreedMemory'))
    assert any('KeepFreedMemory does nothing here' in m
               and 'no glibc allocator' in m for m in messages), messages
    results = dict(img_path='a.jpg')
    assert step(results) is results
    with pytest.raises(RuntimeError, match='no glibc allocator'):
        allocator.keep_freed_memory()

"""``benchmarks/data_loading.py --stages``: each decode setting measured in
its own process, the time of a pair transform by transform for each, the
rates by CPU time with the page faults per pair, ``--ir-color-type`` in
every setting, on the first pairs of a given tree (``--decode-data``, as a
user runs it on real LLVIP files). Timings are never asserted (they belong
to benchmarks/README.md); what is asserted is that each setting ran as
named (the page faults tell whether KeepFreedMemory was active). The
synthetic JPEG trees the script makes are run by
tests/test_benchmarks_smoke.py."""
import re
import sys

import pytest

from mmsafe.datasets import ensure_synthetic_llvip
from mmsafe.datasets.loader import allocator
from tests.utils import run_command

# the scripts (launchers, benchmarks), the planner and the docs do not
# depend on the stack: run at one end (tests/conftest.py)
pytestmark = pytest.mark.one_end

NUMBER = r'[0-9]+\.[0-9]+'
STAGES = ('0 LoadPairedImageFromFile', '1 LoadAnnotations', '2 PairedResize',
          '3 PairedRandomFlip', '4 PackPairedDetInputs')
SETTINGS = ('full decode', 'reduced decode', 'full decode + KeepFreedMemory',
            'reduced decode + KeepFreedMemory (the recipe)')


def test_stages_of_the_recipe_pipeline(tmp_path):
    # a tree in LLVIP's layout with 3 pairs of LLVIP's size; the first 2
    # (by file name) are measured
    tree = str(tmp_path / 'tree') + '/'
    ensure_synthetic_llvip(tree, num_train=3, num_test=1,
                           img_size=(1280, 1024), seed=0)
    result = run_command([
        sys.executable, 'benchmarks/data_loading.py', '--rounds', '0',
        '--large', '0', '--decode', '2', '--decode-rounds', '1',
        '--decode-passes', '1', '--decode-data', tree, '--stages',
        '--data-dir', str(tmp_path / 'unused'), '--ir-color-type',
        'grayscale'
    ], timeout=300)
    assert not result.timed_out and result.returncode == 0, result
    out = result.output
    # the given tree's files as they are (nothing synthetic made), the
    # first 2 pairs; every setting decodes the infrared images as asked
    assert re.search(rf"at 640x512, 2 pairs of 1280x1024 from "
                     rf"{re.escape(tree)}, files as stored \({NUMBER} \| "
                     rf"{NUMBER} bits/pixel, visible \| infrared\), .*, 1 "
                     r"rounds x 1 passes, ir_color_type='grayscale' ==",
                     out), out[-3000:]
    assert not (tmp_path / 'unused').exists()
    faults = {}
    for setting in SETTINGS:
        match = re.search(
            rf'\n{re.escape(setting)} +{NUMBER} \| +{NUMBER} +([0-9]+)\n',
            out)
        assert match, (setting, out[-3000:])
        faults[setting] = int(match.group(1))
    if allocator.unavailable() is None:
        # a process that keeps freed memory faults far fewer pages in
        assert faults['full decode + KeepFreedMemory'] * 10 < \
            faults['full decode'], faults
    for what in ('reduced/full, allocator as it is',
                 'reduced/full, both with KeepFreedMemory',
                 'the recipe / full decode as it is'):
        assert re.search(rf'{what}: {NUMBER}x \(CPU {NUMBER}x\)', out), \
            out[-3000:]
    assert 'per transform, ms per pair' in out, out[-3000:]
    for stage in STAGES:  # the recipe's train pipeline, in its order
        assert re.search(
            rf'  {stage}: {NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER}\n',
            out), out[-3000:]
    assert re.search(rf'OpenCV alone, without page faults .*: decode \+ '
                     rf'resize {NUMBER}, reduced decode {NUMBER} images/s',
                     out), out[-3000:]
    assert 'uptime after:' in out


def test_decode_data_without_llvip_layout_is_refused(tmp_path):
    (tmp_path / 'visible').mkdir()  # no visible/train folder
    result = run_command([
        sys.executable, 'benchmarks/data_loading.py', '--rounds', '0',
        '--large', '0', '--decode-data', str(tmp_path)], timeout=120)
    assert not result.timed_out and result.returncode == 2, result
    assert f'--decode-data {tmp_path}: no visible/train folder there' in \
        result.output, result.output[-2000:]

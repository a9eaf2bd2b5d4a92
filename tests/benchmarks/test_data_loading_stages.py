"""``benchmarks/data_loading.py --stages``: the time of a pair, transform by
transform, full and reduced decode, the rates by CPU time with the page
faults per pair, ``--ir-color-type`` on both sides. Timings are never
asserted (they belong to benchmarks/README.md)."""
import re
import sys

from tests.utils import run_command

NUMBER = r'[0-9]+\.[0-9]+'
STAGES = ('0 LoadPairedImageFromFile', '1 LoadAnnotations', '2 PairedResize',
          '3 PairedRandomFlip', '4 PackPairedDetInputs')


def test_stages_of_the_recipe_pipeline(tmp_path):
    result = run_command([
        sys.executable, 'benchmarks/data_loading.py', '--rounds', '0',
        '--large', '0', '--decode', '2', '--decode-rounds', '1',
        '--decode-quality', '75', '--stages', '--data-dir', str(tmp_path),
        '--ir-color-type', 'grayscale'
    ], timeout=300)
    assert not result.timed_out and result.returncode == 0, result
    out = result.output
    # both sides decode the infrared images as asked
    assert "JPEG quality 75 (" in out and "one worker (this process), " \
        "ir_color_type='grayscale' ==" in out, out[-3000:]
    assert 'per transform, ms per pair (median of the passes): full ' \
        'decode | reduced decode' in out, out[-3000:]
    # the same rates by CPU time, with the page faults of each side
    for what in ('whole train pipeline', 'load \\+ resize only'):
        assert re.search(
            rf'{what}: full decode {NUMBER}, reduced decode {NUMBER} '
            rf'pairs/s per worker; reduced/full: {NUMBER}x\n  by CPU time: '
            rf'full decode {NUMBER}, reduced decode {NUMBER} pairs/s; '
            rf'reduced/full: {NUMBER}x; minor page faults per pair: full '
            r'[0-9]+, reduced [0-9]+\n', out), out[-3000:]
    for stage in STAGES:  # the recipe's train pipeline, in its order
        assert re.search(rf'  {stage}: {NUMBER} \| {NUMBER}\n', out), \
            out[-3000:]
    assert 'uptime after:' in out

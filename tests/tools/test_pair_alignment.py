"""The image-content alignment measure on the synthetic demo data: no
healthy pair is flagged; mirrored or shifted infrared images are flagged
pair by pair; permuted partners are named by the group rule."""
import numpy as np
import pytest
import torch

from mmsafe.datasets.synthetic_llvip import render_pair, synthetic_params
from mmsafe.analysis.pair_alignment import (measure_alignment,
                                            unrelated_pairs)

# configs/llvip/demo_cpu.py's generator settings
DEMO = synthetic_params(num_train=300, num_test=100, img_size=(160, 128),
                        seed=0, max_people=5, empty_ratio=0.25,
                        person_height=(30, 110))


@pytest.fixture(scope='module')
def demo_pairs():
    return [render_pair(DEMO, split, i)[:2]
            for split, n in (('train', 300), ('test', 100))
            for i in range(n)]


def test_healthy_demo_pairs_are_never_flagged(demo_pairs):
    results = [measure_alignment(v, r) for v, r in demo_pairs]
    assert [r for r in results if r['verdict'] != 'aligned'] == []
    # nor any group of 8 or 16 consecutive pairs (what the hook sees)
    for size in (8, 16):
        for start in range(0, len(results) - size + 1):
            assert unrelated_pairs(results[start:start + size]) == [], start


@pytest.mark.parametrize('fault,verdict', [
    (lambda ir: ir[:, ::-1], 'mirrored'),
    (lambda ir: np.roll(ir, 16, axis=1), 'shifted'),
])
def test_mirrored_or_shifted_infrared_is_flagged(demo_pairs, fault,
                                                 verdict):
    results = [measure_alignment(v, fault(r)) for v, r in demo_pairs[:300]]
    flagged = sum(r['verdict'] == verdict for r in results)
    assert flagged >= 0.6 * len(results), flagged
    if verdict == 'shifted':
        shifts = {tuple(r['best_shift']) for r in results
                  if r['verdict'] == 'shifted'}
        assert (16, 0) in shifts or (-16, 0) in shifts, shifts
    # and no group of them passes as healthy
    assert all(unrelated_pairs(results[i:i + 16]) or all(
        r['verdict'] == verdict for r in results[i:i + 16])
        for i in range(0, 285, 16))


def test_permuted_partners_are_named_by_the_group_rule(demo_pairs):
    pairs = demo_pairs[:300]
    results = [measure_alignment(pairs[i][0], pairs[(i + 1) % 300][1])
               for i in range(300)]
    for start in range(0, 300 - 15, 16):
        named = unrelated_pairs(results[start:start + 16])
        assert len(named) >= 12, (start, named)


def test_tensor_input_as_packed_by_the_pipeline(demo_pairs):
    """[C, H, W] uint8 tensors (PackPairedDetInputs) give the same result
    as H x W x C arrays."""
    vis, ir = demo_pairs[0]
    as_arrays = measure_alignment(vis, ir[:, ::-1])
    as_tensors = measure_alignment(
        torch.from_numpy(vis).permute(2, 0, 1),
        torch.from_numpy(np.ascontiguousarray(ir[:, ::-1])).permute(2, 0, 1))
    assert as_arrays == as_tensors

"""Per-box visible/infrared offsets (mmsafe/analysis/object_offsets.py),
calibrated on synthetic scenes whose people are moved by known amounts
between the visible and the infrared frame (by day: the visible people
stand out; the night physics are in test_box_verdicts.py)."""
import cv2
import numpy as np
import pytest

from mmsafe.datasets.synthetic_llvip import render_pair, synthetic_params
from mmsafe.analysis import object_offsets as oo
from mmsafe.analysis.pair_alignment import (alignment_flag,
                                            measure_alignment,
                                            unrelated_pairs)
from tests.tools.check_dataset_toys import DEMO_SYNTHETIC
from tests.tools.offset_scenes import (background, draw_people,
                                       random_people, scene_pairs)


def _shifted_scenes(size, num, height, max_shift, seed=0):
    """Pairs whose people are moved in infrared by random known shifts."""
    bg = background(size, seed)
    rng = np.random.default_rng(seed + 5)
    for k in range(num):
        people = random_people(rng, size, 3, height)
        true = [(float(rng.uniform(-max_shift, max_shift)),
                 float(rng.uniform(-max_shift / 2, max_shift / 2)))
                for _ in people]
        vis, ir, boxes = draw_people(bg, people, true, seed=k)
        yield vis, ir, boxes, true


def test_known_offsets_are_estimated_within_two_pixels():
    errors, measured, total = [], 0, 0
    for vis, ir, boxes, true in _shifted_scenes((640, 512), 6, (60, 250),
                                                12.0):
        result = oo.pair_offsets(vis, ir, boxes)
        for row, (tx, ty) in zip(result['boxes'], true):
            total += 1
            if row['confident']:
                measured += 1
                errors.append(np.hypot(row['dx'] - tx, row['dy'] - ty))
                assert row['d'] == pytest.approx(
                    np.hypot(row['dx'], row['dy']), abs=0.02)
            else:
                assert row['dx'] is None and row['d'] is None
    assert total >= 12
    assert measured >= 0.8 * total, (measured, total)
    assert max(errors) <= 2.0, errors
    assert np.median(errors) <= 0.6, errors


def test_offsets_are_in_original_pixels_after_resize_and_flip():
    size = (640, 512)
    bg = background(size, 1)
    people = [(250.0, 150.0, 70.0, 170.0), (400.0, 200.0, 60.0, 150.0)]
    vis, ir, boxes = draw_people(bg, people, [(10.0, -4.0)] * 2, seed=3)
    half = [cv2.resize(img, (320, 256), interpolation=cv2.INTER_AREA)
            for img in (vis, ir)]
    small = np.asarray(boxes, np.float32) / 2
    # the geometry is what this test is about: the gate of weak matches
    # (calibrated on real night pairs, where these faint synthetic people
    # would mostly get no estimate) is lowered here
    weak = dict(min_corr=0.3)
    result = oo.pair_offsets(*half, small, scale_factor=(0.5, 0.5), **weak)
    assert result['confident'] == 2, result
    for row in result['boxes']:
        assert row['dx'] == pytest.approx(10.0, abs=2.0), row
        assert row['dy'] == pytest.approx(-4.0, abs=2.0), row
    # both images and the boxes flipped left-right by the pipeline: the
    # offset is reported as it is in the original files
    flipped = [np.ascontiguousarray(img[:, ::-1]) for img in (vis, ir)]
    fboxes = np.asarray(boxes, np.float32)
    fboxes[:, [0, 2]] = size[0] - 1 - fboxes[:, [2, 0]]
    result = oo.pair_offsets(*flipped, fboxes, flip_direction='horizontal',
                             **weak)
    assert result['confident'] == 2, result
    for row in result['boxes']:
        assert row['dx'] == pytest.approx(10.0, abs=2.0), row
        assert row['dy'] == pytest.approx(-4.0, abs=2.0), row
    # [C, H, W] inputs (a packed sample) give the same numbers
    chw = oo.pair_offsets(vis.transpose(2, 0, 1), ir.transpose(2, 0, 1),
                          boxes, **weak)
    plain = oo.pair_offsets(vis, ir, boxes, **weak)
    assert plain['confident'] == 2
    assert [r['dx'] for r in chw['boxes']] == \
        [r['dx'] for r in plain['boxes']]


def test_small_or_blank_boxes_get_no_verdict():
    flat = np.full((128, 160, 3), 90, np.uint8)
    result = oo.pair_offsets(flat, flat, [[10, 10, 60, 100], [70, 20, 75,
                                                              40]])
    assert [r['verdict'] for r in result['boxes']] == ['none', 'none']
    assert [r['reason'] for r in result['boxes']] == ['flat', 'small']
    assert [r['label'] for r in result['boxes']] == ['? flat', '? small']
    assert [r['text'] for r in result['boxes']] == ['no verdict: flat',
                                                    'no verdict: small']
    assert result['confident'] == 0 and result['median_d'] is None
    assert result['verdicts'] == 0 and not result['flagged']
    assert all(r['dx'] is None and r['d'] is None and r['disagrees'] is None
               for r in result['boxes'])


def test_healthy_synthetic_pairs_are_not_flagged():
    params = synthetic_params(**{k: v for k, v in DEMO_SYNTHETIC.items()
                                 if k not in ('num_train', 'num_test')})
    ds, boxes, verdicts = [], 0, 0
    for i in range(40):
        vis, ir, b = render_pair(params, 'train', i)
        result = oo.pair_offsets(vis, ir, b)
        assert not result['flagged'], (i, result)
        boxes += len(b)
        verdicts += result['verdicts']
        ds += [r['d'] for r in result['boxes'] if r['confident']]
    assert boxes >= 60 and len(ds) >= 0.3 * boxes, (len(ds), boxes)
    assert np.median(ds) < 1.0
    assert verdicts >= 0.9 * boxes, (verdicts, boxes)
    healthy = [oo.pair_offsets(vis, ir, b)
               for vis, ir, b, _ in scene_pairs((320, 256), 12)]
    assert not any(r['flagged'] for r in healthy)
    assert sum(r['confident'] for r in healthy) >= 12


def test_infrared_from_other_moments_is_flagged_while_whole_images_align():
    pairs = list(scene_pairs((320, 256), 16, other_moment=True))
    alignments = [measure_alignment(vis, ir) for vis, ir, _, _ in pairs]
    # the whole-image check sees the same background and stays clean
    assert not any(alignment_flag(a) for a in alignments), alignments
    assert unrelated_pairs(alignments) == []
    results = [oo.pair_offsets(vis, ir, b) for vis, ir, b, _ in pairs]
    flagged = [r for r in results if r['flagged']]
    assert len(flagged) >= 12, [r['median_d'] for r in results]
    for r in flagged:
        # each box moved 15-35 px: matched beyond max_offset, or its place
        # empty in infrared
        assert all(b['disagrees'] is not False for b in r['boxes'])
        assert r['median_d'] is None or r['median_d'] > 8.0
        message = oo.offsets_message(r)
        assert 'another moment' in message
        if r['confident']:
            assert 'median |d|' in message
    # the moves measured are the moves made (15-35 px sideways)
    for (_, _, _, shifts), r in zip(pairs, results):
        for row, (sx, sy) in zip(r['boxes'], shifts):
            if row['confident'] and row['d'] > 8:
                assert row['dx'] == pytest.approx(sx, abs=2.0), (row, sx)
                assert row['dy'] == pytest.approx(sy, abs=2.0), (row, sy)


def test_max_offset_decides_the_flag():
    bg = background((640, 512), 0)
    people = [(100.0, 100.0, 60.0, 150.0), (350.0, 200.0, 70.0, 180.0)]
    vis, ir, boxes = draw_people(bg, people, [(6.0, 0.0)] * 2, seed=1)
    assert oo.pair_offsets(vis, ir, boxes)['flagged'] is False
    tight = oo.pair_offsets(vis, ir, boxes, max_offset=4.0)
    assert tight['flagged'] is True
    assert tight['median_d'] == pytest.approx(6.0, abs=1.0)


def test_summary_per_dataset_and_folder():
    def row(v):
        # a matched |d| (disagreeing beyond 8 px), or a verdict's name
        if isinstance(v, float):
            return dict(verdict='matched', d=v, confident=True,
                        disagrees=v > 8.0)
        return dict(verdict=v, d=None, confident=False,
                    disagrees=None if v == 'none' else v == 'empty')

    def rec(path, verdicts, flagged=False):
        return dict(img_path=path, offsets=dict(
            boxes=[row(v) for v in verdicts], flagged=flagged))
    records = [rec('/d/set00/V000/visible/I1.jpg', [1.0, 2.0, 'none']),
               rec('/d/set00/V000/visible/I2.jpg', [3.0, 'warm', 'warm']),
               rec('/d/set01/V001/visible/I1.jpg',
                   [20.0, 30.0, 'empty', 'outline'], True),
               dict(img_path='/d/x.jpg')]
    s = oo.offsets_summary(records)
    assert (s['boxes'], s['verdicts'], s['confident'], s['disagree'],
            s['pairs'], s['flagged_pairs']) == (10, 9, 5, 3, 3, 1)
    assert s['by_verdict'] == dict(matched=5, warm=2, outline=1, empty=1,
                                   none=1)
    assert s['median'] == 3.0 and s['max'] == 30.0
    assert s['p95'] == pytest.approx(np.percentile([1, 2, 3, 20, 30], 95))
    assert sorted(s['d']) == [1.0, 2.0, 3.0, 20.0, 30.0]
    a = s['per_folder']['/d/set00/V000/visible']
    b = s['per_folder']['/d/set01/V001/visible']
    assert (a['boxes'], a['verdicts'], a['confident'], a['median'],
            a['pairs'], a['flagged_pairs']) == (6, 5, 3, 2.0, 2, 0)
    assert (b['boxes'], b['verdicts'], b['confident'], b['median'],
            b['pairs'], b['flagged_pairs']) == (4, 4, 2, 25.0, 1, 1)
    assert b['by_verdict']['empty'] == 1 and 'd' not in b
    text = oo.format_summary(s)
    assert '9 of 10 boxes with a verdict (90%) in 3 pairs' in text
    assert '5 matched, 2 warm here, 1 outline here, 1 nothing here' in text
    assert 'median 3.0' in text and '95th percentile' in text
    # the worst folder first
    assert text.index('set01/V001') < text.index('set00/V000')


def test_histogram_png(tmp_path):
    path = oo.write_histogram(str(tmp_path / 'h.png'), [0.5] * 30 + [20.0],
                              max_offset=8.0)
    img = cv2.imread(path)
    assert img.shape == (360, 640, 3)
    bar = np.all(img == (180, 120, 40), axis=2)
    cols = np.nonzero(bar.any(axis=0))[0]
    # the tall bar of 30 boxes near 0 and the short one of 1 box at 20 px
    assert cols.min() < 80 and cols.max() > 400
    heights = bar.sum(axis=0)
    assert heights[cols.min()] > 20 * heights[cols.max()]


def test_benchmark_reports_boxes_per_second():
    result = oo.benchmark(size=(320, 256), pairs=2)
    assert result['boxes'] > 0 and result['boxes_per_second'] > 0
    assert 0 <= result['confident'] <= result['verdicts'] <= result['boxes']

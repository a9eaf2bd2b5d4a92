"""Per-box verdicts of the visible/infrared check at night
(mmsafe/analysis/object_offsets.py, box_presence.py, box_matching.py):
dark visible crops with little to match, warm infrared people; an
infrared folder one file late; cold people; weak alignment; the labels
drawn on the picture."""
import numpy as np
import pytest

from mmsafe.analysis import object_offsets as oo
from mmsafe.analysis.box_matching import box_match
from mmsafe.analysis.box_presence import infrared_presence
from mmsafe.analysis.offset_pictures import AGREES, DISAGREES, draw_offsets
from mmsafe.analysis.pair_vis import GAP, draw_pair
from tests.tools.offset_scenes import (background, draw_people, night,
                                       night_pairs)

SIZE = (320, 256)


def _iou(a, b):
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) -
             ix * iy)
    return ix * iy / union


def test_night_boxes_get_a_verdict_where_visible_matching_abstains():
    pairs = list(night_pairs(SIZE, 12))
    boxes = sum(len(b) for _, _, b, _ in pairs)
    # the fixture's physics: the dark visible crops carry too little to be
    # found in the infrared image (the measure of visible crops alone)
    visible_only = sum(
        box_match(vis, ir, box, templates=('visible', ))['confident']
        for vis, ir, b, _ in pairs for box in b)
    assert boxes >= 20 and visible_only <= 0.3 * boxes, (visible_only, boxes)
    results = [oo.pair_offsets(vis, ir, b) for vis, ir, b, _ in pairs]
    assert sum(r['verdicts'] for r in results) >= 0.9 * boxes
    assert not any(r['flagged'] for r in results)
    for r in results:
        assert r['disagree'] == 0, r['boxes']
        for row in r['boxes']:
            assert row['verdict'] in ('warm', 'matched'), row
            if row['verdict'] == 'warm':
                assert row['contrast'] >= 1.0 and row['dx'] is None
                assert row['label'] == f"warm {row['contrast']:.1f}"
                assert row['text'] == 'warm here'
            else:
                assert row['d'] <= 2.0, row


def test_infrared_folder_one_file_late_is_flagged_at_night():
    pairs = list(night_pairs(SIZE, 12, late=True))
    results = [oo.pair_offsets(vis, ir, b) for vis, ir, b, _ in pairs]
    flagged = [r for r in results if r['flagged']]
    assert len(flagged) >= 11, [[b['label'] for b in r['boxes']]
                                for r in results]
    rows = [(row, irb) for r, (_, _, _, irb) in zip(results, pairs)
            for row in r['boxes']]
    empty = [row for row, _ in rows if row['verdict'] == 'empty']
    assert len(empty) >= 0.6 * len(rows)
    for row in empty:
        assert row['disagrees'] is True and row['text'] == 'nothing here'
        assert row['label'].startswith('empty ')
        assert '-0.0' not in row['label']
    # a box is vouched for where a person of that moment stands, or now
    # and then where it takes in a warm structure of the street (a wall
    # warmer than the ground)
    vouched = [(row, irb) for row, irb in rows if row['disagrees'] is False]
    by_person = [row for row, irb in vouched
                 if max(_iou(row['box'], b) for b in irb) > 0.2]
    assert len(vouched) - len(by_person) <= 0.1 * len(rows), vouched
    for r in flagged:
        message = oo.offsets_message(r)
        assert 'with nothing in the infrared image where the box is' in message
        assert f"{r['disagree']} disagree" in message
        assert 'another moment' in message


def test_a_match_of_background_edges_does_not_vouch_for_an_empty_box():
    # a person on a street's fixed structures; the infrared image is the
    # same street without the person: the visible crop's edges (the
    # street's) are found in place, but no body is there
    bg = night(background(SIZE, 4))
    bg = (bg[0] * 4.0 - 18.0, bg[1])  # enough light for the street
    person = (150.0, 60.0, 40.0, 100.0)
    vis, ir, boxes = draw_people(bg, [person], seed=2, cloth=(3, 5),
                                 ir_people=[])
    match = box_match(vis, ir, boxes[0], templates=('visible', ))
    assert match['confident'] and np.hypot(match['dx'], match['dy']) < 1.0
    row = oo.pair_offsets(vis, ir, boxes)['boxes'][0]
    assert row['verdict'] == 'empty' and row['disagrees'] is True, row
    assert row['reason'] == 'match on no body'


def test_cold_people_do_not_flag_a_pair_of_warm_ones():
    people = [(20.0, 40.0, 36.0, 90.0), (110.0, 60.0, 34.0, 85.0),
              (200.0, 50.0, 38.0, 95.0)]
    bg = night(background(SIZE, 1))

    def measure(temps):
        vis, ir, boxes = draw_people(bg, people, seed=5, cloth=(3, 7),
                                     temps=temps, vis_noise=4.0)
        return oo.pair_offsets(vis, ir, boxes)

    one_cold = measure([200.0, None, 210.0])
    assert [b['disagrees'] for b in one_cold['boxes']] == [False, True,
                                                           False]
    assert one_cold['boxes'][1]['verdict'] == 'empty'
    assert (one_cold['agree'], one_cold['disagree']) == (2, 1)
    assert not one_cold['flagged']
    # half cold: a tie does not flag either; most cold does
    tie = oo.pair_offsets(*draw_people(bg, people[:2], seed=5, cloth=(3, 7),
                                       temps=[200.0, None], vis_noise=4.0))
    assert (tie['agree'], tie['disagree'], tie['flagged']) == (1, 1, False)
    two_cold = measure([None, None, 210.0])
    assert (two_cold['agree'], two_cold['disagree']) == (1, 2)
    assert two_cold['flagged']


@pytest.mark.parametrize('shift,flagged', [((4.0, 2.0), False),
                                           ((14.0, 0.0), True)])
def test_weak_alignment_within_max_offset_is_silent(shift, flagged):
    """KAIST-like pairs: every infrared person offset by the same few
    pixels; by day (structured visible people) the offsets are matched and
    only those beyond ``max_offset`` flag; at night the bodies stay in
    their boxes (``warm``) for a few pixels."""
    people = [(40.0, 50.0, 40.0, 100.0), (150.0, 70.0, 36.0, 90.0),
              (240.0, 40.0, 42.0, 105.0)]
    day = draw_people(background(SIZE, 3), people, [shift] * 3, seed=1)
    result = oo.pair_offsets(*day, max_offset=8.0)
    assert result['flagged'] is flagged, result['boxes']
    matched = [b for b in result['boxes'] if b['verdict'] == 'matched']
    assert len(matched) >= 2
    for b in matched:
        assert b['dx'] == pytest.approx(shift[0], abs=2.0)
        assert b['dy'] == pytest.approx(shift[1], abs=2.0)
        assert b['disagrees'] is flagged
    if not flagged:
        dark = draw_people(night(background(SIZE, 3)), people, [shift] * 3,
                           seed=1, cloth=(3, 7), vis_noise=4.0)
        result = oo.pair_offsets(*dark)
        assert not result['flagged']
        assert result['agree'] == 3, result['boxes']


def test_presence_states():
    rng = np.random.default_rng(0)
    ground = (60 + rng.normal(0, 3, (120, 160))).astype(np.float32)
    box = (60, 30, 90, 90)
    warm = ground.copy()
    warm[40:80, 66:84] = 190
    r = infrared_presence(warm, box)
    assert r['state'] == 'warm' and r['contrast'] > 5
    # a body no warmer than a ground warmed by the day: its outline shows
    outline = ground.copy()
    outline[40:80, 66:84] = 60 + 50 * np.where(
        (np.arange(40)[:, None] // 4 + np.arange(18)[None, :] // 4) % 2, 1,
        -1)
    r = infrared_presence(outline, box)
    assert r['state'] == 'outline' and abs(r['contrast']) < 1.0
    assert r['texture'] >= 2.0
    r = infrared_presence(ground, box)
    assert r['state'] == 'empty'
    assert r['contrast'] < 0.6 and r['texture'] < 1.5
    assert infrared_presence(np.full((120, 160), 90, np.uint8),
                             box)['state'] == 'flat'
    assert infrared_presence(warm, (10, 10, 16, 40))['state'] == 'small'
    # a box filling the image: no ring to compare with
    assert infrared_presence(warm, (2, 2, 158, 118))['state'] == 'border'
    # three equal channels read as one; float input as uint8
    rgb = np.repeat(np.round(warm).clip(0, 255).astype(np.uint8)[..., None],
                    3, axis=2)
    assert infrared_presence(rgb, box)['state'] == 'warm'
    assert infrared_presence(warm.astype(np.float64), box)['state'] == 'warm'


def _coloured(img, colour):
    """Pixels of ``colour`` (BGR, channels 0 or 255), text anti-aliased or
    not (OpenCV 5 smooths its text)."""
    on = np.asarray(colour) > 0
    return np.all(np.where(on, img > 150, img < 90), axis=2)


def test_each_box_is_labelled_on_the_picture():
    vis, ir, boxes, _ = next(night_pairs(SIZE, 1, late=True, seed=1))
    _, ir_ok, _, _ = next(night_pairs(SIZE, 1, seed=1))
    for infrared, colour in ((ir, DISAGREES), (ir_ok, AGREES)):
        result = oo.pair_offsets(vis, infrared, boxes)
        canvas = draw_pair(vis, infrared, boxes)
        draw_offsets(canvas, result, vis.shape[1], GAP)
        for row in result['boxes']:
            if row['disagrees'] is None:
                continue
            expected = DISAGREES if row['disagrees'] else AGREES
            x1, _, _, y2 = (int(round(v)) for v in row['box'])
            x1 += vis.shape[1] + GAP
            below = canvas[y2 + 1:y2 + 14, max(0, x1 - 2):x1 + 60]
            hit = _coloured(below, expected).sum()
            assert hit > 10, (row['label'], hit)
            # and not in the other colour
            other = AGREES if expected == DISAGREES else DISAGREES
            assert _coloured(below, other).sum() == 0, row['label']
        assert any(row['disagrees'] == (colour == DISAGREES)
                   for row in result['boxes'])


def test_infrared_template_finds_the_offset_too():
    """The infrared box looked for in the visible image (an option of
    box_match) measures the same infrared-minus-visible offset as the
    visible box looked for in the infrared image."""
    people = [(40.0, 50.0, 40.0, 100.0), (150.0, 70.0, 36.0, 90.0),
              (240.0, 40.0, 42.0, 105.0)]
    # a dusk scene: dim visible people, a dark street
    vis, ir, boxes = draw_people(night(background(SIZE, 0)), people,
                                 [(5.0, -2.0)] * 3, seed=3, cloth=(12, 20),
                                 vis_noise=4.0)
    for box in boxes:
        one = box_match(vis, ir, box, templates=('infrared', ))
        assert one['confident'] and one['template'] == 'infrared', one
        assert one['dx'] == pytest.approx(5.0, abs=1.0)
        assert one['dy'] == pytest.approx(-2.0, abs=1.0)
        both = box_match(vis, ir, box, templates=('visible', 'infrared'))
        assert both['confident'] and both['corr'] >= one['corr'] - 1e-6
    # the default is the visible box alone
    assert box_match(vis, ir, boxes[0])['template'] == 'visible'


def test_a_near_perfect_match_counts_whatever_the_box_holds():
    """The visible image loaded twice (FirstBatchStatsHook names that
    fault itself): the dim visible person is no warm body, but the box's
    content is found in place with correlation 1 and agrees; a weaker
    match of the same place on the infrared image of the scene without
    the person does not."""
    bg = night(background(SIZE, 4))
    bg = (bg[0] * 4.0 - 18.0, bg[1])
    person = (150.0, 60.0, 40.0, 100.0)
    vis, ir, boxes = draw_people(bg, [person], seed=2, cloth=(3, 5),
                                 ir_people=[])
    row = oo.pair_offsets(vis, vis, boxes)['boxes'][0]
    assert row['verdict'] == 'matched' and row['corr'] > 0.99, row
    assert row['presence'] == 'empty' and row['disagrees'] is False
    row = oo.pair_offsets(vis, ir, boxes)['boxes'][0]
    assert row['corr'] < 0.9 and row['verdict'] == 'empty', row
    row = oo.pair_offsets(vis, vis, boxes, strong_corr=1.01)['boxes'][0]
    assert row['verdict'] == 'empty', row


def test_benchmark_measures_a_tree_as_paired_and_one_file_late(tmp_path,
                                                               capsys):
    """benchmarks/object_offsets.py --llvip-root: the verdicts of a tree in
    LLVIP's layout, as paired and with the next file's infrared image."""
    import importlib.util
    import re

    from tests.tools.offset_scenes import write_llvip_night_tree
    from tests.utils import REPO_ROOT
    spec = importlib.util.spec_from_file_location(
        'object_offsets_benchmark',
        f'{REPO_ROOT}/benchmarks/object_offsets.py')
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    root = write_llvip_night_tree(str(tmp_path / 'night'), SIZE, 6)
    result = bench.measure_tree(root)
    paired, late = result['as paired'], result['infrared one file late']
    assert (paired['pairs'], late['pairs']) == (6, 5)
    assert paired['verdicts'] >= 0.9 * paired['boxes']
    assert paired['flagged'] == 0 and late['flagged'] >= 4, result
    assert late['counts']['empty'] > late['counts']['warm']
    # resized to half and the infrared moved by 2 px: still silent
    half = bench.measure_tree(root, scale=0.5, ir_shift=(2.0, 1.0))
    assert half['as paired']['flagged'] == 0
    assert half['infrared one file late']['flagged'] >= 4
    assert bench.main(['--llvip-root', root, '--limit', '3']) == 0
    out = capsys.readouterr().out
    assert re.search(r'as paired: 3 pairs, \d+ of \d+ boxes with a verdict '
                     r'\([0-9.]+%; matched \d+, warm \d+, outline \d+, '
                     r'empty \d+, none \d+\); 0 of 3 pairs flagged', out), out
    assert 'infrared one file late: 3 pairs' in out
    with pytest.raises(FileNotFoundError, match='no annotated pair'):
        bench.measure_tree(str(tmp_path))

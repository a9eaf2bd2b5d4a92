"""KAISTMissRate against hand-computed miss rates: the KAIST devkit's
ignore rules (labels, bbGt flag, border, inclusive height range,
occlusion), no filter on detections, squarify only in the CVPR 2015
setting, every score counted (negative ones too), the day/night split and
Dollar's matching order."""
import math

import numpy as np
import pytest

import mmsafe  # noqa: F401  (registers the metrics)
from mmsafe.evaluation.kaist_protocol import (SETTINGS, condition_of,
                                              ground_truth)
from mmsafe.evaluation.miss_rate import evaluate_image

TINY = 1e-10


def mr(misses):
    """MR^-2 from the miss rates read at the nine reference FPPIs."""
    assert len(misses) == 9
    return math.exp(sum(math.log(max(TINY, m)) for m in misses) / 9)


def obj(label, x, y, w, h, occ=0, ign=0):
    return dict(label_name=label, bbox=[x, y, x + w, y + h], occlusion=occ,
                ign=ign)


def det(x, y, w, h, score):
    return ([x, y, x + w, y + h], score)


def sample(img_id, objects, dets):
    boxes = np.array([d[0] for d in dets], dtype=np.float64).reshape(-1, 4)
    return dict(img_id=img_id, instances=objects,
                pred_instances=dict(
                    bboxes=boxes,
                    scores=np.array([d[1] for d in dets], dtype=np.float64),
                    labels=np.zeros(len(dets), dtype=np.int64)))


def evaluate(samples, **kwargs):
    from mmdet.registry import METRICS
    metric = METRICS.build(dict(type='KAISTMissRate', **kwargs))
    metric.dataset_meta = dict(classes=('person', ))
    metric.process({}, samples)
    return metric.evaluate(len(samples))


PERSON = obj('person', 100, 100, 30, 60)
HIT = det(100, 100, 30, 60, .5)


def one_frame(objects, dets, setting='reasonable'):
    result = evaluate([sample('set06/V000/I00019', objects, dets)],
                      settings=(setting, ))
    key = 'kaist/MR-2' if setting == 'reasonable' else f'kaist/MR-2_{setting}'
    return result[key]


# one frame: a false positive (score .9) before the hit (.5) puts the hit
# at FPPI 1: miss 1 at the eight references below 1, 0 at 1
FP_THEN_HIT = mr([1] * 8 + [0])
# the hit first: miss 0 everywhere
HIT_FIRST = mr([0] * 9)


@pytest.mark.parametrize('other,why', [
    (obj('person', 4, 100, 30, 60), 'left edge x = 4 < 5'),
    (obj('person', 606, 100, 30, 60), 'right edge x + w = 636 > 635'),
    (obj('person', 300, 4, 30, 60), 'top edge y = 4 < 5'),
    (obj('person', 300, 448, 30, 60), 'bottom edge y + h = 508 > 507'),
    (obj('person', 300, 100, 30, 54), 'height 54 < 55'),
    (obj('person', 300, 100, 30, 60, occ=2), 'heavy occlusion'),
    (obj('person', 300, 100, 30, 60, ign=1), 'the bbGt ignore flag'),
    (obj('people', 300, 100, 30, 60), 'people'),
    (obj('person?', 300, 100, 30, 60), 'person?'),
    (obj('cyclist', 300, 100, 30, 60), 'cyclist'),
])
def test_ignore_regions_of_the_reasonable_setting(other, why):
    """A detection on an ignore region is neither a hit nor a false
    positive, and the region is not a person to find."""
    x1, y1, x2, y2 = other['bbox']
    on_it = det(x1, y1, x2 - x1, y2 - y1, .9)
    assert one_frame([PERSON, other], [on_it, HIT]) == \
        pytest.approx(HIT_FIRST), why
    # without a detection on it, nothing is missed either
    assert one_frame([PERSON, other], [HIT]) == pytest.approx(HIT_FIRST), why


@pytest.mark.parametrize('edge', [
    obj('person', 5, 100, 30, 60), obj('person', 605, 100, 30, 60),
    obj('person', 300, 5, 30, 60), obj('person', 300, 447, 30, 60),
    obj('person', 300, 100, 30, 55), obj('person', 300, 100, 30, 60, occ=1),
])
def test_the_ranges_are_inclusive(edge):
    """x = 5, x + w = 635, y = 5, y + h = 507, h = 55 and partial
    occlusion are counted: a miss of it costs the frame's second person."""
    # two persons, one found: miss 1/2 everywhere
    assert one_frame([PERSON, edge], [HIT]) == pytest.approx(mr([.5] * 9))


def test_other_labels_are_dropped_not_ignored():
    """A label outside person / people / person? / cyclist (the sanitized
    annotations' person?a) is no ignore region: a detection on it is a
    false positive."""
    other = obj('person?a', 300, 100, 30, 60)
    assert one_frame([PERSON, other], [det(300, 100, 30, 60, .9), HIT]) == \
        pytest.approx(FP_THEN_HIT)


def test_detections_are_not_filtered_by_height():
    """A 30 px detection on nothing is a false positive (the KAIST devkit
    has no detection height filter, unlike Caltech's 55 / 1.25 px)."""
    assert one_frame([PERSON], [det(400, 100, 12, 30, .9), HIT]) == \
        pytest.approx(FP_THEN_HIT)
    assert one_frame([PERSON], [det(400, 100, 150, 400, .9), HIT]) == \
        pytest.approx(FP_THEN_HIT)


def test_squarify_only_in_the_cvpr15_setting():
    """cvpr15-reasonable widens a counted 20x100 person to 41x100 about its
    centre (x 89.5); a 41x100 detection there is a hit only then (IoU
    with the annotated box 2000 / 4100 = 0.49)."""
    person = obj('person', 100, 100, 20, 100)
    wide = det(89.5, 100, 41, 100, .9)
    assert one_frame([person], [wide], 'cvpr15-reasonable') == \
        pytest.approx(HIT_FIRST)
    # reasonable: a false positive and a miss
    assert one_frame([person], [wide]) == pytest.approx(1.0)
    boxes, ignore = ground_truth([person], SETTINGS['cvpr15-reasonable'])
    assert boxes.tolist() == [[89.5, 100.0, 41.0, 100.0]]
    # its border range: y + h = 480 > 475 is ignored there, not in
    # reasonable
    low = obj('person', 300, 420, 30, 60)
    assert ground_truth([low], SETTINGS['cvpr15-reasonable'])[1].tolist() \
        == [True]
    assert ground_truth([low], SETTINGS['reasonable'])[1].tolist() == \
        [False]


def test_the_all_setting():
    """'all': height >= 20 and every occlusion level."""
    small_heavy = obj('person', 300, 100, 10, 20, occ=2)
    objects = [PERSON, small_heavy]
    result = evaluate([sample('set06/V000/I00019', objects, [HIT])],
                      settings=('reasonable', 'all'))
    assert result['kaist/MR-2'] == pytest.approx(HIT_FIRST)
    assert result['kaist/MR-2_all'] == pytest.approx(mr([.5] * 9))
    tiny = obj('person', 300, 100, 10, 19)
    assert one_frame([PERSON, tiny], [HIT], 'all') == \
        pytest.approx(HIT_FIRST)


def test_negative_scores_count_and_rank_below_positive_ones():
    # all scores negative: the false positive (-0.1) ranks before the hit
    assert one_frame([PERSON], [det(400, 100, 30, 60, -.1),
                                det(100, 100, 30, 60, -.5)]) == \
        pytest.approx(FP_THEN_HIT)
    # a positive hit before a negative false positive
    assert one_frame([PERSON], [det(400, 100, 30, 60, -3.0),
                                det(100, 100, 30, 60, 2.0)]) == \
        pytest.approx(HIT_FIRST)


def test_day_and_night_frames_are_scored_apart():
    """Day: sets 00-02, 06-08; night: sets 03-05, 09-11. Each condition
    counts its own frames."""
    day = sample('set06/V000/I00019', [PERSON],
                 [det(100, 100, 30, 60, .7)])
    night = sample('set09/V000/I00019', [PERSON],
                   [det(400, 100, 30, 60, .9), det(100, 100, 30, 60, .5)])
    result = evaluate([night, day])
    assert result['kaist/MR-2_day'] == pytest.approx(HIT_FIRST)
    assert result['kaist/MR-2_night'] == pytest.approx(FP_THEN_HIT)
    # both frames: FP (.9) at FPPI .5, then both hits: miss 1 at the
    # seven references below .5, 0 at .5623 and 1
    assert result['kaist/MR-2'] == pytest.approx(mr([1] * 7 + [0, 0]))
    assert result['kaist/MR-2_all'] == pytest.approx(mr([1] * 7 + [0, 0]))
    assert {k for k in result} == {
        f'kaist/MR-2{s}{c}' for s in ('', '_all')
        for c in ('', '_day', '_night')}
    # a list of day frames only reports no night key
    assert 'kaist/MR-2_night' not in evaluate([day])
    assert [condition_of(f'set{n:02d}/V000/I00001') for n in range(12)] == \
        ['day'] * 3 + ['night'] * 3 + ['day'] * 3 + ['night'] * 3
    with pytest.raises(ValueError, match='set12'):
        condition_of('set12/V000/I00001')


def test_equal_scores_keep_the_frames_name_order():
    """The devkit reads frames sorted by name: of two equal scores the
    earlier frame's detection comes first, whatever order the frames were
    evaluated in."""
    first = sample('set06/V000/I00019', [], [det(400, 100, 30, 60, .5)])
    second = sample('set06/V000/I00039', [PERSON],
                    [det(100, 100, 30, 60, .5)])
    # the false positive at FPPI .5 first, then the hit
    expected = mr([1] * 7 + [0, 0])
    assert evaluate([second, first])['kaist/MR-2'] == pytest.approx(expected)
    assert evaluate([first, second])['kaist/MR-2'] == pytest.approx(expected)


def test_of_equal_overlaps_the_last_box_is_matched():
    """bbGt keeps the last of equally good boxes: the first detection
    takes B, so the second (IoU .67 with A, .43 with B) still hits A."""
    gt = np.array([[0, 0, 10, 10], [2, 0, 10, 10]], dtype=float)
    dets = np.array([[1, 0, 10, 10], [-2, 0, 10, 10]], dtype=float)
    scores, outcome = evaluate_image(dets, [.9, .8], gt,
                                     np.zeros(2, bool))
    assert outcome.tolist() == [1, 1]
    # a counted box is preferred to an ignore region; an ignore region
    # takes any number of detections (overlap over the detection's area)
    ignore = np.array([False, True])
    big = np.array([[0, 0, 10, 10], [0, 0, 100, 100]], dtype=float)
    _, outcome = evaluate_image(np.array([[0, 0, 10, 10]] * 3, float),
                                [.9, .8, .7], big, ignore)
    assert outcome.tolist() == [1, -1, -1]


def test_without_raw_annotation_the_metric_says_what_to_add():
    broken = sample('set06/V000/I00019', [PERSON], [HIT])
    del broken['instances']
    with pytest.raises(KeyError, match="add 'instances' to meta_keys"):
        evaluate([broken])
    with pytest.raises(ValueError, match='unknown KAIST setting'):
        evaluate([], settings=('reasonable', 'crowded'))


def test_det_file_round_trips_through_the_devkit_format(tmp_path):
    from mmsafe.evaluation.kaist_det_files import read_detections
    path = str(tmp_path / 'dets' / 'kaist_det.txt')
    frames = [sample('set09/V000/I00019', [PERSON],
                     [det(400.25, 100, 30, 60, .9), HIT]),
              sample('set06/V000/I00019', [PERSON], [])]
    result = evaluate(frames, det_file=path)
    with open(path) as f:
        lines = f.read().splitlines()
    # ids follow the frames sorted by name: set06 is 1 (no detection)
    assert lines == ['2,400.2500,100.0000,30.0000,60.0000,0.9',
                     '2,100.0000,100.0000,30.0000,60.0000,0.5']
    dets = read_detections(path, ['set09/V000/I00019', 'set06/V000/I00019'])
    again = [sample(k, [PERSON], [det(*row[:4], row[4]) for row in v])
             for k, v in dets.items()]
    assert evaluate(again) == result

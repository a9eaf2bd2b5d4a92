"""KAIST's log-average miss rate and COCO-style mAP on hand-made
predictions whose answer is known."""
import math

import numpy as np
import pytest
import torch

from mmdet.registry import METRICS

import mmsafe  # noqa: F401  (registers the metrics)


def sample(img_id, gt, pred, ignored=(), shape=(100, 100)):
    """A packed data sample as the evaluator passes it (``to_dict()``)."""
    def inst(boxes, scores=None):
        boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
        out = dict(bboxes=boxes, labels=torch.zeros(len(boxes),
                                                    dtype=torch.long))
        if scores is not None:
            out['scores'] = torch.tensor(scores, dtype=torch.float32)
        return out
    return dict(img_id=img_id, ori_shape=shape, gt_instances=inst(gt),
                ignored_instances=inst(list(ignored)),
                pred_instances=inst([p[0] for p in pred],
                                    [p[1] for p in pred]))


def evaluate(metric_cfg, samples, classes=('person', )):
    metric = METRICS.build(metric_cfg)
    metric.dataset_meta = dict(classes=classes)
    metric.process({}, samples)
    return metric.evaluate(len(samples))


A = [10, 10, 30, 60]
B = [50, 10, 70, 60]
C = [10, 10, 30, 60]


def test_miss_rate_known_answer():
    # two images, three people. Detections by score: TP .9, FP .8 (nothing
    # there), TP .7 (B); a detection on an ignore region (.95) and a second
    # detection of A (.85, FP) on image 1 -> ordered: TP, FP, FP, TP.
    # FPPI after each: 0, .5, 1, 1; recall 1/3, 1/3, 1/3, 2/3.
    # Refs 1e-2..10^-0.25 (8 points) read recall 1/3 (last FPPI <= ref is 0
    # or .5), ref 1e0 reads 2/3: MR = exp((8 ln(2/3) + ln(1/3)) / 9).
    samples = [
        sample('a', gt=[A, B], ignored=[[80, 70, 95, 95]],
               pred=[(A, .9), ([80, 70, 95, 95], .95), ([12, 10, 30, 60], .85),
                     (B, .7)]),
        sample('b', gt=[C], pred=[([60, 60, 80, 99], .8)]),
    ]
    result = evaluate(dict(type='LogAverageMissRate'), samples)
    expected = math.exp((8 * math.log(2 / 3) + math.log(1 / 3)) / 9)
    assert result['kaist/MR-2'] == pytest.approx(expected, rel=1e-9)


def test_miss_rate_perfect_and_hopeless():
    perfect = [sample('a', gt=[A, B], pred=[(A, .9), (B, .8)])]
    assert evaluate(dict(type='LogAverageMissRate'), perfect)[
        'kaist/MR-2'] == pytest.approx(1e-10)
    # two images, one person, ten confident false positives before it:
    # FPPI reaches 5 before any hit: miss rate 1 at every reference point
    wrong = [sample('a', gt=[A], pred=[([60, 60, 70, 70], .9)] * 10 +
                    [(A, .1)]), sample('b', gt=[], pred=[])]
    assert evaluate(dict(type='LogAverageMissRate'), wrong)[
        'kaist/MR-2'] == pytest.approx(1.0)


def test_log_average_miss_rate_function():
    from mmsafe.evaluation import log_average_miss_rate
    # one image, 1 gt found after one FP: FPPI 1 -> miss 0 at ref 1e0 only
    value = log_average_miss_rate(np.array([.9, .5]), np.array([0, 1]), 1, 1)
    assert value == pytest.approx(math.exp(8 * math.log(1.0) / 9 +
                                           math.log(1e-10) / 9))


def test_coco_style_map50_and_map50_95_known_answer():
    # every prediction overlaps its box with IoU 0.62: a hit at IoU 0.50,
    # 0.55, 0.60 and a miss at 0.65..0.95 -> mAP50 = 1, mAP50:95 = 3/10.
    gt = [0, 0, 50, 50]
    pred = [0, 0, 50 / 0.62, 50]  # intersection 2500 / union 2500 / 0.62
    samples = [sample(str(i), gt=[gt], pred=[(pred, .9)], shape=(200, 200))
               for i in range(3)]
    result = evaluate(dict(type='CocoStyleMetric'), samples)
    assert result['coco/bbox_mAP_50'] == pytest.approx(1.0)
    assert result['coco/bbox_mAP'] == pytest.approx(0.3, abs=1e-3)


def test_coco_style_ignored_ground_truth_is_crowd():
    # a detection on an ignored box is neither a hit nor a false positive
    samples = [sample('a', gt=[A], ignored=[B], pred=[(A, .9), (B, .95)])]
    result = evaluate(dict(type='CocoStyleMetric'), samples)
    assert result['coco/bbox_mAP'] == pytest.approx(1.0)


def test_coco_style_refuses_an_annotation_file():
    with pytest.raises(ValueError, match='ann_file'):
        METRICS.build(dict(type='CocoStyleMetric', ann_file='x.json'))


def test_miss_rate_counts_negative_scores_unless_told():
    # one image: a false positive at -0.1 ranks before the hit at -0.5
    samples = [sample('a', gt=[A], pred=[([60, 60, 80, 99], -.1),
                                         (A, -.5)])]
    fp_first = math.exp(math.log(1e-10) / 9)
    assert evaluate(dict(type='LogAverageMissRate'), samples)[
        'kaist/MR-2'] == pytest.approx(fp_first)
    # score_thr drops them: nothing detected
    assert evaluate(dict(type='LogAverageMissRate', score_thr=0.0),
                    samples)['kaist/MR-2'] == pytest.approx(1.0)

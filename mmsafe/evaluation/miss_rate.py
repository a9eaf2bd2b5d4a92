"""Log-average miss rate (MR^-2), the metric of KAIST / Caltech pedestrian
benchmarks, with Dollar et al.'s matching rules (``bbGt`` of Piotr Dollar's
toolbox, which the KAIST devkit runs):

- Per image, detections are taken best score first (equal scores in their
  given order). Each one matches the not yet matched counted ground-truth
  box with the highest IoU >= ``iou_thr`` (of equal IoUs the last one);
  failing that, it is ignored (neither true nor false positive) when it
  covers an ignore region: intersection over the *detection's* area >=
  ``iou_thr``, an ignore region taking any number of detections. Every
  other detection is a false positive.
- Over all images, the detections (each image's in the order above, the
  images in order) are sorted by score, highest first, equal scores
  keeping that order; the ignored ones are left out. The miss rate
  ``1 - TP / #gt`` is read at nine FPPI values spaced evenly in log space
  from 1e-2 to 1e0, each at the last point whose false positives per image
  do not exceed it (a miss rate of 1 where none does). MR^-2 is their
  geometric mean, each miss rate clamped below at 1e-10.
- Scores are used as given: a negative score ranks below a positive one
  and counts like any other.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mmengine.evaluator import BaseMetric
from mmengine.logging import MMLogger

from mmsafe.registry import METRICS

#: the nine FPPI reference points of MR^-2
FPPI_REFS = np.logspace(-2.0, 0.0, 9)


def overlaps(det: np.ndarray, gt: np.ndarray,
             crowd: np.ndarray) -> np.ndarray:
    """Overlap of each detection with each ground-truth box.

    Args:
        det (np.ndarray): ``(n, 4)`` detections as ``x, y, w, h``.
        gt (np.ndarray): ``(m, 4)`` ground truth as ``x, y, w, h``.
        crowd (np.ndarray): ``(m, )`` bool, the ignore regions: their
            overlap is intersection over the detection's area.

    Returns:
        np.ndarray: ``(n, m)``: IoU, or intersection over the detection's
        area for ignore regions; 0 where the boxes do not overlap.
    """
    det = np.asarray(det, dtype=np.float64).reshape(-1, 4)
    gt = np.asarray(gt, dtype=np.float64).reshape(-1, 4)
    w = (np.minimum(det[:, None, 0] + det[:, None, 2], gt[None, :, 0] +
                    gt[None, :, 2]) - np.maximum(det[:, None, 0],
                                                 gt[None, :, 0]))
    h = (np.minimum(det[:, None, 1] + det[:, None, 3], gt[None, :, 1] +
                    gt[None, :, 3]) - np.maximum(det[:, None, 1],
                                                 gt[None, :, 1]))
    inter = np.where((w > 0) & (h > 0), w * h, 0.0)
    det_area = (det[:, 2] * det[:, 3])[:, None]
    gt_area = (gt[:, 2] * gt[:, 3])[None, :]
    union = np.where(np.asarray(crowd, dtype=bool)[None, :], det_area,
                     det_area + gt_area - inter)
    with np.errstate(divide='ignore', invalid='ignore'):
        return np.where(inter > 0, inter / union, 0.0)


def evaluate_image(det: np.ndarray, scores: np.ndarray, gt: np.ndarray,
                   gt_ignore: np.ndarray,
                   iou_thr: float = 0.5) -> Tuple[np.ndarray, np.ndarray]:
    """Match one image's detections (Dollar's rules, see the module).

    Args:
        det (np.ndarray): ``(n, 4)`` detections as ``x, y, w, h``.
        scores (np.ndarray): ``(n, )`` their scores.
        gt (np.ndarray): ``(m, 4)`` ground truth as ``x, y, w, h``.
        gt_ignore (np.ndarray): ``(m, )`` bool, True for ignore regions.
        iou_thr (float): the match threshold.

    Returns:
        tuple: the scores best first (equal scores in their given order)
        and, in that order, each detection's outcome: 1 true positive,
        0 false positive, -1 ignored.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    order = np.argsort(-scores, kind='stable')
    det = np.asarray(det, dtype=np.float64).reshape(-1, 4)[order]
    gt_ignore = np.asarray(gt_ignore, dtype=bool).reshape(-1)
    outcome = np.zeros(len(order), dtype=np.int64)
    if len(order) and len(gt_ignore):
        oa = overlaps(det, gt, gt_ignore)
        counted = np.nonzero(~gt_ignore)[0]
        taken = np.zeros(len(gt_ignore), dtype=bool)
        for d in range(len(order)):
            free = counted[~taken[counted]]
            if len(free):
                best = oa[d, free].max()
                if best >= iou_thr:
                    # of equal overlaps the last box wins, as in bbGt
                    g = free[np.nonzero(oa[d, free] == best)[0][-1]]
                    taken[g] = True
                    outcome[d] = 1
                    continue
            if (oa[d, gt_ignore] >= iou_thr).any():
                outcome[d] = -1
    return scores[order], outcome


def match_image(det_boxes: np.ndarray, det_scores: np.ndarray,
                gt_boxes: np.ndarray, ignore_boxes: np.ndarray,
                iou_thr: float = 0.5) -> np.ndarray:
    """Outcome of each detection of one image, ``x1, y1, x2, y2`` boxes.

    Returns:
        np.ndarray: per detection (in the given order) 1 (true positive),
        0 (false positive) or -1 (ignored).
    """
    det = _xywh(det_boxes)
    gt = np.concatenate([_xywh(gt_boxes), _xywh(ignore_boxes)])
    ignore = np.r_[np.zeros(len(gt_boxes), bool),
                   np.ones(len(ignore_boxes), bool)]
    _, sorted_outcome = evaluate_image(det, det_scores, gt, ignore, iou_thr)
    outcome = np.zeros(len(det), dtype=np.int64)
    outcome[np.argsort(-np.asarray(det_scores, dtype=np.float64),
                       kind='stable')] = sorted_outcome
    return outcome


def log_average_miss_rate(scores: np.ndarray, outcomes: np.ndarray,
                          num_gt: int, num_images: int,
                          refs: np.ndarray = FPPI_REFS) -> float:
    """MR^-2 from all detections' scores and outcomes (1 TP, 0 FP,
    -1 ignored), in image order, the number of counted ground-truth boxes
    and of images. NaN without ground truth."""
    if num_gt == 0:
        return float('nan')
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    outcomes = np.asarray(outcomes).reshape(-1)
    keep = outcomes >= 0
    scores, outcomes = scores[keep], outcomes[keep]
    order = np.argsort(-scores, kind='stable')
    tp = np.cumsum(outcomes[order] == 1)
    fp = np.cumsum(outcomes[order] == 0)
    fppi = np.concatenate([[-np.inf], fp / max(num_images, 1)])
    recall = np.concatenate([[0.0], tp / num_gt])
    miss = [1.0 - recall[np.nonzero(fppi <= ref)[0][-1]] for ref in refs]
    return float(np.exp(np.mean(np.log(np.maximum(1e-10, miss)))))


def _xywh(boxes: np.ndarray) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    return np.c_[boxes[:, :2], boxes[:, 2:] - boxes[:, :2]]


def as_numpy(instances: Optional[dict], key: str) -> np.ndarray:
    """``instances[key]`` (a tensor, ``HorizontalBoxes`` or array) as a
    numpy array; empty when missing."""
    if not instances or key not in instances:
        return np.zeros((0, 4) if key == 'bboxes' else (0, ))
    value = instances[key]
    value = value.tensor if hasattr(value, 'tensor') else value
    if hasattr(value, 'detach'):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


@METRICS.register_module()
class LogAverageMissRate(BaseMetric):
    """Log-average miss rate MR^-2 over FPPI 1e-2..1e0 (lower is better).

    Ground truth comes from the packed samples' ``gt_instances``; boxes in
    ``ignored_instances`` are ignore regions. Boxes must be in the original
    image's coordinates (``LoadAnnotations`` after the resize). For KAIST,
    ``KAISTMissRate`` applies the benchmark's own settings to the raw
    annotation instead.

    Args:
        iou_thr (float): the match threshold. Defaults to 0.5.
        score_thr (float, optional): detections below it are dropped.
            Defaults to None: every detection counts, whatever its score
            (negative scores too), as in Dollar's evaluation.
        per_class (bool): also report ``MR-2_{class}`` per class. Defaults
            to False.
        collect_device (str): ``'cpu'`` or ``'gpu'``.
        prefix (str): key prefix. Defaults to ``'kaist'``: the key is
            ``kaist/MR-2`` (``val/kaist/MR-2`` in TensorBoard).
    """

    default_prefix: Optional[str] = 'kaist'

    def __init__(self, iou_thr: float = 0.5,
                 score_thr: Optional[float] = None,
                 per_class: bool = False, collect_device: str = 'cpu',
                 prefix: Optional[str] = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.iou_thr = iou_thr
        self.score_thr = score_thr
        self.per_class = per_class

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        """Match each image's detections; keep only the outcomes."""
        for sample in data_samples:
            pred = sample['pred_instances']
            boxes = as_numpy(pred, 'bboxes').reshape(-1, 4)
            scores = as_numpy(pred, 'scores').reshape(-1)
            labels = as_numpy(pred, 'labels').reshape(-1)
            if self.score_thr is not None:
                keep = scores >= self.score_thr
                boxes, scores, labels = boxes[keep], scores[keep], labels[
                    keep]
            gt = sample.get('gt_instances')
            ign = sample.get('ignored_instances')
            gt_boxes = as_numpy(gt, 'bboxes').reshape(-1, 4)
            gt_labels = as_numpy(gt, 'labels').reshape(-1)
            ign_boxes = as_numpy(ign, 'bboxes').reshape(-1, 4)
            ign_labels = as_numpy(ign, 'labels').reshape(-1)
            per_label: Dict[int, tuple] = {}
            for label in set(labels.tolist()) | set(gt_labels.tolist()):
                d = labels == label
                g = gt_labels == label
                i = ign_labels == label
                boxes_all = np.concatenate(
                    [_xywh(gt_boxes[g]), _xywh(ign_boxes[i])])
                flags = np.r_[np.zeros(int(g.sum()), bool),
                              np.ones(int(i.sum()), bool)]
                per_label[int(label)] = (*evaluate_image(
                    _xywh(boxes[d]), scores[d], boxes_all, flags,
                    self.iou_thr), int(g.sum()))
            self.results.append(per_label)

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        """MR^-2 over all classes' detections and per class."""
        num_images = len(results)
        classes = (self.dataset_meta or {}).get('classes', ())
        labels = sorted({k for r in results for k in r})
        pooled_scores, pooled_outcomes, pooled_gt = [], [], 0
        metrics: Dict[str, float] = {}
        for label in labels:
            scores = [r[label][0] for r in results if label in r]
            outcomes = [r[label][1] for r in results if label in r]
            num_gt = sum(r[label][2] for r in results if label in r)
            pooled_scores += scores
            pooled_outcomes += outcomes
            pooled_gt += num_gt
            if self.per_class:
                name = classes[label] if label < len(classes) else label
                metrics[f'MR-2_{name}'] = log_average_miss_rate(
                    np.concatenate(scores), np.concatenate(outcomes),
                    num_gt, num_images)
        if pooled_gt == 0:
            MMLogger.get_current_instance().warning(
                'LogAverageMissRate: no ground-truth box to miss; MR-2 is '
                'NaN')
        metrics['MR-2'] = log_average_miss_rate(
            np.concatenate(pooled_scores) if pooled_scores else np.zeros(0),
            np.concatenate(pooled_outcomes) if pooled_outcomes else
            np.zeros(0, dtype=np.int64), pooled_gt, num_images)
        return {'MR-2': metrics.pop('MR-2'), **metrics}

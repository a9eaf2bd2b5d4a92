"""Log-average miss rate (MR^-2), the metric of KAIST / Caltech pedestrian
benchmarks.

Per image, detections (best score first) are matched to the unmatched
ground-truth box of the same label with the highest IoU >= ``iou_thr``; a
detection that matches none but covers an ignored box (intersection over
the detection's area >= ``iou_thr``) is ignored (neither true nor false
positive); every other detection is a false positive. Over all images,
detections sorted by score give the miss rate ``1 - TP / #gt`` as a
function of false positives per image ``FP / #images``. MR^-2 is the
geometric mean of the miss rate at nine FPPI values spaced evenly in log
space from 1e-2 to 1e0, each read at the last point whose FPPI does not
exceed it (a miss rate of 1 where none does), clamped below at 1e-10:
Dollar et al.'s evaluation protocol.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
from mmengine.evaluator import BaseMetric
from mmengine.logging import MMLogger

from mmdet.registry import METRICS

#: the nine FPPI reference points of MR^-2
FPPI_REFS = np.logspace(-2.0, 0.0, 9)


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(
        boxes[:, 3] - boxes[:, 1], 0, None)


def _intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    return wh[..., 0] * wh[..., 1]


def match_image(det_boxes: np.ndarray, det_scores: np.ndarray,
                gt_boxes: np.ndarray, ignore_boxes: np.ndarray,
                iou_thr: float = 0.5) -> np.ndarray:
    """Outcome of each detection of one image (one label).

    Returns:
        np.ndarray: per detection (in the given order) 1 (true positive),
        0 (false positive) or -1 (ignored).
    """
    n = len(det_boxes)
    outcome = np.zeros(n, dtype=np.int64)
    if n == 0:
        return outcome
    order = np.argsort(-det_scores, kind='stable')
    if len(gt_boxes):
        inter = _intersection(det_boxes, gt_boxes)
        union = _area(det_boxes)[:, None] + _area(gt_boxes)[None] - inter
        iou = inter / np.maximum(union, 1e-12)
    else:
        iou = np.zeros((n, 0))
    if len(ignore_boxes):
        ioa = _intersection(det_boxes, ignore_boxes) / np.maximum(
            _area(det_boxes)[:, None], 1e-12)
    else:
        ioa = np.zeros((n, 0))
    taken = np.zeros(len(gt_boxes), dtype=bool)
    for d in order:
        if len(gt_boxes):
            cand = np.where(taken, -1.0, iou[d])
            best = int(np.argmax(cand))
            if cand[best] >= iou_thr:
                taken[best] = True
                outcome[d] = 1
                continue
        if ioa.shape[1] and ioa[d].max() >= iou_thr:
            outcome[d] = -1
    return outcome


def log_average_miss_rate(scores: np.ndarray, outcomes: np.ndarray,
                          num_gt: int, num_images: int,
                          refs: np.ndarray = FPPI_REFS) -> float:
    """MR^-2 from all detections' scores and outcomes (1 TP, 0 FP,
    -1 ignored), the number of (non-ignored) ground-truth boxes and of
    images."""
    if num_gt == 0:
        return float('nan')
    keep = outcomes >= 0
    scores, outcomes = scores[keep], outcomes[keep]
    order = np.argsort(-scores, kind='stable')
    tp = np.cumsum(outcomes[order] == 1)
    fp = np.cumsum(outcomes[order] == 0)
    fppi = np.concatenate([[-np.inf], fp / max(num_images, 1)])
    recall = np.concatenate([[0.0], tp / num_gt])
    miss = []
    for ref in refs:
        last = np.nonzero(fppi <= ref)[0][-1]
        miss.append(1.0 - recall[last])
    return float(np.exp(np.mean(np.log(np.maximum(1e-10, miss)))))


def _numpy(instances: Optional[dict], key: str) -> np.ndarray:
    if not instances or key not in instances:
        return np.zeros((0, 4) if key == 'bboxes' else (0, ))
    value = instances[key]
    value = value.tensor if hasattr(value, 'tensor') else value
    return value.detach().cpu().numpy()


@METRICS.register_module()
class LogAverageMissRate(BaseMetric):
    """Log-average miss rate MR^-2 over FPPI 1e-2..1e0 (lower is better).

    Ground truth comes from the packed samples' ``gt_instances``; boxes in
    ``ignored_instances`` (KAIST: people, cyclists, ``person?``, persons
    outside the evaluation setting) are ignore regions. Boxes must be in the
    original image's coordinates (``LoadAnnotations`` after the resize).

    Args:
        iou_thr (float): the match threshold. Defaults to 0.5.
        score_thr (float): detections below it are dropped. Defaults to 0.
        per_class (bool): also report ``MR-2_{class}`` per class. Defaults
            to False.
        collect_device (str): ``'cpu'`` or ``'gpu'``.
        prefix (str): key prefix. Defaults to ``'kaist'``: the key is
            ``kaist/MR-2`` (``val/kaist/MR-2`` in TensorBoard).
    """

    default_prefix: Optional[str] = 'kaist'

    def __init__(self, iou_thr: float = 0.5, score_thr: float = 0.0,
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
            boxes = _numpy(pred, 'bboxes').reshape(-1, 4)
            scores = _numpy(pred, 'scores').reshape(-1)
            labels = _numpy(pred, 'labels').reshape(-1)
            keep = scores >= self.score_thr
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
            gt = sample.get('gt_instances')
            ign = sample.get('ignored_instances')
            gt_boxes = _numpy(gt, 'bboxes').reshape(-1, 4)
            gt_labels = _numpy(gt, 'labels').reshape(-1)
            ign_boxes = _numpy(ign, 'bboxes').reshape(-1, 4)
            ign_labels = _numpy(ign, 'labels').reshape(-1)
            per_label: Dict[int, tuple] = {}
            for label in set(labels.tolist()) | set(gt_labels.tolist()):
                d = labels == label
                outcome = match_image(boxes[d], scores[d],
                                      gt_boxes[gt_labels == label],
                                      ign_boxes[ign_labels == label],
                                      self.iou_thr)
                per_label[int(label)] = (scores[d], outcome,
                                         int((gt_labels == label).sum()))
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

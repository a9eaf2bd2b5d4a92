"""KAIST's log-average miss rate as the benchmark's devkit computes it.

The settings (which ground truth counts) are
:mod:`mmsafe.evaluation.kaist_protocol`'s; the matching and the curve are
:mod:`mmsafe.evaluation.miss_rate`'s. The metric reads each frame's raw
annotation (label, box, occlusion, bbGt ignore flag), not the dataset's
training ignore flags, so the evaluation is the benchmark's whatever the
dataset's ``min_height`` / ``max_occlusion``.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
from mmengine.evaluator import BaseMetric
from mmengine.logging import MMLogger

from mmsafe.registry import METRICS
from mmsafe.errors import MMSafeKeyError
from .kaist_det_files import write_combined
from .kaist_protocol import (CONDITIONS, condition_of, get_setting,
                             ground_truth, setting_names)
from .miss_rate import as_numpy, evaluate_image, log_average_miss_rate

#: the packed sample key that carries the frame's raw annotation
RAW_KEY = 'instances'


def metric_key(setting: str, condition: Optional[str] = None) -> str:
    """``MR-2`` (reasonable, every frame), ``MR-2_day``, ``MR-2_all``,
    ``MR-2_all_night``, ..."""
    parts = ['MR-2']
    if setting != 'reasonable':
        parts.append(setting)
    if condition:
        parts.append(condition)
    return '_'.join(parts)


@METRICS.register_module()
class KAISTMissRate(BaseMetric):
    """KAIST MR^-2 (lower is better), as the KAIST devkit computes it.

    For each setting (``'reasonable'``: height >= 55 px, no or partial
    occlusion; ``'all'``: height >= 20 px, any occlusion; see
    ``mmsafe.evaluation.kaist_protocol.SETTINGS``), over every frame and
    over the day and the night frames. With ``prefix='kaist'`` the keys are
    ``kaist/MR-2`` (reasonable, every frame), ``kaist/MR-2_day``,
    ``kaist/MR-2_night``, ``kaist/MR-2_all`` (the 'all' setting),
    ``kaist/MR-2_all_day``, ``kaist/MR-2_all_night``; a condition without
    frames in the evaluated list is not reported.

    Each packed sample must carry the frame's raw annotation: put
    ``'instances'`` in ``PackPairedDetInputs``' ``meta_keys`` (the KAIST
    dataset config does). Predictions must be in the original image's
    coordinates. Every detection counts, whatever its score.

    Args:
        settings (Sequence[str]): the settings to report. Defaults to
            ``('reasonable', 'all')``.
        iou_thr (float): the match threshold. Defaults to 0.5.
        det_file (str, optional): also write the predictions to this file
            in the devkit's combined format (``id,x,y,w,h,score`` per line,
            ``id`` the 1-based index of the frame among the evaluated
            frames sorted by id), for the official devkit.
        collect_device (str): ``'cpu'`` or ``'gpu'``.
        prefix (str, optional): key prefix. Defaults to ``'kaist'``.
    """

    default_prefix: Optional[str] = 'kaist'

    def __init__(self, settings: Sequence[str] = ('reasonable', 'all'),
                 iou_thr: float = 0.5, det_file: Optional[str] = None,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.settings = setting_names(settings)
        self.iou_thr = iou_thr
        self.det_file = det_file

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        """Match each frame's detections under every setting; keep the
        scores and outcomes only."""
        for sample in data_samples:
            if RAW_KEY not in sample:
                raise MMSafeKeyError(
                    'KAISTMissRate needs each frame\'s raw annotation: add '
                    f"{RAW_KEY!r} to meta_keys of PackPairedDetInputs in "
                    'the test pipeline (configs/_base_/datasets/kaist.py '
                    f'does); sample {sample.get("img_id")!r} has keys '
                    f'{sorted(sample)}')
            pred = sample['pred_instances']
            boxes = as_numpy(pred, 'bboxes').astype(np.float64).reshape(
                -1, 4)
            scores = as_numpy(pred, 'scores').astype(np.float64).reshape(-1)
            det = np.c_[boxes[:, :2], boxes[:, 2:] - boxes[:, :2]]
            per_setting = {}
            for name in self.settings:
                gt, ignore = ground_truth(sample[RAW_KEY], get_setting(name))
                sorted_scores, outcome = evaluate_image(
                    det, scores, gt, ignore, self.iou_thr)
                per_setting[name] = (sorted_scores, outcome,
                                     int((~ignore).sum()))
            result = dict(img_id=str(sample['img_id']),
                          condition=condition_of(sample['img_id']),
                          settings=per_setting)
            if self.det_file:
                result['det'] = np.c_[det, scores]
            self.results.append(result)

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        """MR^-2 per setting over every frame, day and night frames."""
        # the devkit's order: frames sorted by name, which decides the
        # order of detections with equal scores
        results = sorted(results, key=lambda r: r['img_id'])
        if self.det_file:
            write_combined(self.det_file, [r['det'] for r in results])
            MMLogger.get_current_instance().info(
                f'KAISTMissRate: wrote {len(results)} frames\' detections '
                f'to {self.det_file} (the devkit\'s combined format)')
        metrics: Dict[str, float] = {}
        groups = [(None, results)] + [
            (c, [r for r in results if r['condition'] == c])
            for c in CONDITIONS]
        for name in self.settings:
            for condition, group in groups:
                if not group:
                    continue
                parts = [r['settings'][name] for r in group]
                num_gt = sum(p[2] for p in parts)
                value = log_average_miss_rate(
                    np.concatenate([p[0] for p in parts]),
                    np.concatenate([p[1] for p in parts]), num_gt,
                    len(group))
                if num_gt == 0:
                    MMLogger.get_current_instance().warning(
                        f'KAISTMissRate: no {name} ground truth in the '
                        f'{condition or "evaluated"} frames; '
                        f'{metric_key(name, condition)} is NaN')
                metrics[metric_key(name, condition)] = value
        return metrics

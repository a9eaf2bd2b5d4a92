"""Score detection files in the KAIST devkit's formats with a dataset and
an evaluator built from a config (tools/eval_kaist.py)."""
from typing import Dict, List

import numpy as np
import torch

from .kaist_det_files import read_detections


def _instances(boxes: List[list]) -> dict:
    return dict(
        bboxes=torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        labels=torch.zeros(len(boxes), dtype=torch.long))


def frame_sample(info: dict, det: np.ndarray) -> dict:
    """A packed sample as the test pipeline and the model make it: the
    frame's raw annotation (``instances``), its ground truth and ignore
    regions by the dataset's flags, and ``det`` (``x, y, w, h, score``
    rows, kept in float64) as the predictions."""
    det = np.asarray(det, dtype=np.float64).reshape(-1, 5)
    boxes = np.c_[det[:, :2], det[:, :2] + det[:, 2:4]]
    shape = (info['height'], info['width'])
    instances = info['instances']
    return dict(
        img_id=info['img_id'], img_path=info['img_path'],
        ori_shape=shape, img_shape=shape, instances=instances,
        gt_instances=_instances(
            [i['bbox'] for i in instances if not i['ignore_flag']]),
        ignored_instances=_instances(
            [i['bbox'] for i in instances if i['ignore_flag']]),
        pred_instances=dict(
            bboxes=torch.from_numpy(boxes),
            scores=torch.from_numpy(det[:, 4].copy()),
            labels=torch.zeros(len(det), dtype=torch.long)))


def score_detections(dataset, evaluator, det_path: str) -> Dict[str, float]:
    """Evaluate a combined detection file or a per-frame folder.

    Args:
        dataset: a built ``KAISTDataset`` (its frames are the evaluated
            ones; combined-file ids index them sorted by name).
        evaluator: an MMEngine ``Evaluator`` (e.g. the config's
            ``test_evaluator``), its ``dataset_meta`` set.
        det_path (str): the detections.

    Returns:
        dict: the evaluator's metrics.
    """
    infos = [dataset.get_data_info(i) for i in range(len(dataset))]
    dets = read_detections(det_path, [i['img_id'] for i in infos])
    samples = [frame_sample(i, dets[i['img_id']]) for i in infos]
    evaluator.process(data_samples=samples, data_batch=None)
    return evaluator.evaluate(len(samples))

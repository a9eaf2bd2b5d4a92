"""COCO-style box AP (mAP50:95, mAP50, mAP75, by size) for datasets without
a COCO json (VOC xml, KAIST txt): the ground truth comes from the packed
data samples, as for MMDetection's ``VOCMetric``."""
from typing import List, Sequence

from mmdet.evaluation import CocoMetric
from mmsafe.registry import METRICS
from mmsafe.errors import MMSafeValueError


def _instances(gt: dict, ignore_flag: int) -> List[dict]:
    """``gt_instances``/``ignored_instances`` of a packed sample as the
    ``instances`` list of a data info (xyxy boxes, labels, ignore flag)."""
    if not gt or 'bboxes' not in gt:
        return []
    boxes = gt['bboxes']
    boxes = boxes.tensor if hasattr(boxes, 'tensor') else boxes
    boxes = boxes.cpu().numpy().tolist()
    labels = gt['labels'].cpu().numpy().tolist()
    return [dict(bbox=b, bbox_label=int(l), ignore_flag=ignore_flag)
            for b, l in zip(boxes, labels)]


@METRICS.register_module()
class CocoStyleMetric(CocoMetric):
    """MMDetection's ``CocoMetric`` (box AP over IoU 0.50:0.95, AP50, AP75,
    AP by size, pycocotools) with the ground truth taken from each packed
    sample's ``gt_instances`` (ignored ones from ``ignored_instances``, as
    COCO ``iscrowd``), so no COCO annotation file is needed.

    The boxes must be in the original image's coordinates: in the test
    pipeline, ``LoadAnnotations`` comes after the resize (as for
    ``VOCMetric``). The keys are MMDetection's: ``{prefix}/bbox_mAP``
    (mAP50:95), ``{prefix}/bbox_mAP_50``, ``{prefix}/bbox_mAP_75``,
    ``{prefix}/bbox_mAP_s|m|l``.

    Args:
        prefix (str): the key prefix. Defaults to ``'coco'``.
        **kwargs: :class:`mmdet.evaluation.CocoMetric` arguments except
            ``ann_file`` (the ground truth comes from the samples) and
            ``metric`` (always ``'bbox'``).
    """

    def __init__(self, prefix: str = 'coco', **kwargs) -> None:
        for key in ('ann_file', 'metric'):
            if key in kwargs:
                raise MMSafeValueError(
                    f'CocoStyleMetric takes no {key!r}: it evaluates boxes '
                    'against the ground truth of the samples; use '
                    "CocoMetric for a COCO json")
        super().__init__(metric='bbox', prefix=prefix, **kwargs)

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        """Attach ``instances`` built from the packed ground truth."""
        for sample in data_samples:
            if 'instances' not in sample:
                sample['instances'] = (
                    _instances(sample.get('gt_instances'), 0) +
                    _instances(sample.get('ignored_instances'), 1))
        super().process(data_batch, data_samples)

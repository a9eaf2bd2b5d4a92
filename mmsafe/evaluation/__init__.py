"""Metrics of the RGB-T benchmarks, registered in MMDetection's METRICS:
``CocoStyleMetric`` (COCO mAP50:95 and mAP50 from the packed ground truth,
no COCO json needed) and ``LogAverageMissRate`` (KAIST's MR^-2)."""
from .coco_style import CocoStyleMetric
from .miss_rate import LogAverageMissRate, log_average_miss_rate

__all__ = ['CocoStyleMetric', 'LogAverageMissRate', 'log_average_miss_rate']

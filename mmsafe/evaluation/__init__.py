"""Metrics of the RGB-T benchmarks, registered in MMDetection's METRICS:
``CocoStyleMetric`` (COCO mAP50:95 and mAP50 from the packed ground truth,
no COCO json needed), ``LogAverageMissRate`` (MR^-2 from the packed ground
truth) and ``KAISTMissRate`` (KAIST's MR^-2 as the benchmark's devkit
computes it: its settings, day/night)."""
from .coco_style import CocoStyleMetric
from .kaist_miss_rate import KAISTMissRate
from .kaist_protocol import SETTINGS as KAIST_SETTINGS
from .kaist_protocol import KAISTSetting
from .miss_rate import LogAverageMissRate, log_average_miss_rate

__all__ = [
    'CocoStyleMetric', 'KAISTMissRate', 'KAISTSetting', 'KAIST_SETTINGS',
    'LogAverageMissRate', 'log_average_miss_rate'
]

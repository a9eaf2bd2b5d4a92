"""Faulty images for the spike tests on the demo detector (imported by the
training subprocess through ``custom_imports``).

:class:`RawCountsInfrared` turns the infrared image of listed samples into
a radiometric 16-bit frame read unchanged: raw sensor counts 51300-52150
(the range of a FLIR ADAS 16-bit TIFF) as float32, among 8-bit images.
``benchmarks/grad_spikes.py`` measured what it does to the demo detector
with the LLVIP recipe's BatchNorm setting (``norm_eval=True``,
``frozen_stages=1``): the gradient norm x28-x360 (x36-x5700 in the
training runs of the tests), the loss x5-x280. It is
a transform of the pipeline, so it works in loader workers and on every
rank, tied to file names.
"""
import os.path as osp
from typing import Sequence

import numpy as np
from mmcv.transforms import BaseTransform

from mmdet.registry import TRANSFORMS

RAW16_LOW, RAW16_HIGH = 51300.0, 52150.0


@TRANSFORMS.register_module()
class RawCountsInfrared(BaseTransform):
    """Replace the infrared image of the samples whose visible file stem is
    in ``stems`` by raw 16-bit counts (float32).

    Args:
        stems (Sequence[str]): file stems (``'010201'``) of the faulty
            samples.
    """

    def __init__(self, stems: Sequence[str] = ()) -> None:
        self.stems = frozenset(str(s) for s in stems)

    def transform(self, results: dict) -> dict:
        stem = osp.splitext(osp.basename(results['img_path']))[0]
        if stem in self.stems:
            ir = results['ir_img'].astype(np.float32)
            results['ir_img'] = RAW16_LOW + ir * (
                (RAW16_HIGH - RAW16_LOW) / 255.0)
        return results

"""Whether an image is nearly constant: nothing to align or match.

A 16-bit thermal frame of raw counts 51,300-52,150 decoded to 8 bits
keeps its high byte: values 200-203, a standard deviation of about 0.5
grey levels. Such an image carries no structure, so the pairing measures
(:mod:`.pair_alignment`, :mod:`.object_offsets`) would only read noise
from it: ``FirstBatchStatsHook`` flags the modality (``nearly_constant``)
and the pairing checks of the hook and of ``mmsafe-check-dataset``
abstain on the pair.
"""
from typing import Any, Optional

import numpy as np

#: standard deviation (grey levels of 0-255 data) below which an image is
#: nearly constant; natural 8-bit images, night scenes included, lie far
#: above, a high-byte 16-bit frame far below
NEAR_CONSTANT_STD = 2.0


def near_constant(img: Any,
                  threshold: float = NEAR_CONSTANT_STD) -> Optional[float]:
    """The standard deviation of an image's values (all channels, as
    float64) when it is below ``threshold``, else None.

    Args:
        img (Tensor | ndarray): the image as the pipeline delivers it.
        threshold (float): see :data:`NEAR_CONSTANT_STD`.
    """
    if img is None:
        return None
    if hasattr(img, 'detach'):
        img = img.detach().cpu().numpy()
    values = np.asarray(img)
    if values.size < 2:
        return None
    spread = float(values.std(dtype=np.float64))
    return spread if spread < threshold else None

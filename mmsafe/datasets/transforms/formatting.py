"""Pack a visible + infrared sample for the data preprocessor."""
import numpy as np
import torch

from mmdet.datasets.transforms import PackDetInputs
from mmsafe.registry import TRANSFORMS
from mmsafe.errors import MMSafeKeyError, MMSafeValueError
from .bit_depth import BIT_DEPTH_KEY
from .geometry_record import divergence
from .same_size import chw_tensor

PAIRED_META_KEYS = ('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                    'img_shape', 'scale_factor', 'flip', 'flip_direction')


def image_to_tensor(img: np.ndarray) -> torch.Tensor:
    """H x W (x C) array -> C x H x W tensor (dtype kept), as PackDetInputs
    packs ``img`` (see :func:`.same_size.chw_tensor`)."""
    return chw_tensor(img)


@TRANSFORMS.register_module()
class PackPairedDetInputs(PackDetInputs):
    """:class:`mmdet.datasets.transforms.PackDetInputs` for pairs.

    Output::

        dict(inputs=dict(visible=Tensor[3, H, W], infrared=Tensor[3, H, W]),
             data_samples=DetDataSample)

    ``gt_instances`` / ``ignored_instances`` and the meta keys are packed as
    PackDetInputs does (of MMDetection 3.3: a meta key the results do not
    hold is left out); the default meta keys add ``ir_img_path``. The
    tensors keep the images' dtype (uint8 from LoadPairedImageFromFile);
    both are the tensor PackDetInputs makes of an image, converted by
    :func:`image_to_tensor`.

    The record of an image of more than 8 bits per channel (its depth,
    range and the rule that kept it, ``bit_depth`` of
    :class:`~.loading.LoadPairedImageFromFile`) is added to the data
    sample's meta whenever the results carry one.

    A sample whose two images differ in size, or whose recorded visible and
    infrared geometries differ (see :mod:`.geometry_record`), is refused with a
    ``ValueError`` naming the transform where they diverged.

    Args:
        meta_keys (Sequence[str]): meta keys copied into the data sample.
    """

    pair_aware = True

    def __init__(self, meta_keys=PAIRED_META_KEYS) -> None:
        super().__init__(meta_keys=meta_keys)

    def transform(self, results: dict) -> dict:
        """Pack ``img``, ``ir_img``, the annotations and the meta keys."""
        if 'ir_img' not in results or 'img' not in results:
            raise MMSafeKeyError(
                'PackPairedDetInputs needs both "img" and "ir_img" (sample '
                f'{results.get("img_path")}); load pairs with '
                'LoadPairedImageFromFile.')
        ir_img = results['ir_img']
        diverged = divergence(results)
        if diverged:
            raise MMSafeValueError(
                'PackPairedDetInputs: the visible and infrared images differ '
                'in size or geometry (sample '
                f'{results.get("img_path")} | {results.get("ir_img_path")}): '
                f'{diverged}. A geometric transform was applied to one '
                'modality only; use the Paired* transforms (or '
                'PairedGeometric) for every geometric step.')
        if 'img' in self.meta_keys:
            packed = self._pack(results)
            visible = packed['inputs']
        else:
            # the annotations and meta keys as PackDetInputs packs them;
            # the image converted here
            img = results.pop('img')
            try:
                packed = self._pack(results)
            finally:
                results['img'] = img
            visible = image_to_tensor(img)
        packed['inputs'] = dict(
            visible=visible, infrared=image_to_tensor(ir_img))
        if results.get(BIT_DEPTH_KEY):
            packed['data_samples'].set_metainfo(
                {BIT_DEPTH_KEY: results[BIT_DEPTH_KEY]})
        return packed

    def _pack(self, results: dict) -> dict:
        """PackDetInputs on ``results``, with the meta keys that ``results``
        holds (a test pipeline has no flip, a pipeline without a resize no
        ``scale_factor``): MMDetection 3.3 packs those and skips the rest,
        3.0 to 3.2 refuse a missing one; mmsafe packs as 3.3 does on
        each."""
        configured = self.meta_keys
        self.meta_keys = tuple(k for k in configured if k in results)
        try:
            return super().transform(results)
        finally:
            self.meta_keys = configured

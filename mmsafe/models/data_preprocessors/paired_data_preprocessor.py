"""Data preprocessor for paired (visible + infrared) detection inputs."""
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseDataPreprocessor
from mmengine.model.utils import stack_batch
from mmengine.utils import is_seq_of
from torch import Tensor

from mmdet.models.utils.misc import samplelist_boxtype2tensor
from mmsafe.registry import MODELS, builds_in_mmsafe_scope
from mmsafe.errors import (MMSafeKeyError, MMSafeRuntimeError, MMSafeTypeError,
                           MMSafeValueError)

MODALITIES = ('visible', 'infrared')


@MODELS.register_module()
class PairedDetDataPreprocessor(BaseDataPreprocessor):
    """Pre-processor for visible + infrared detection batches.

    Each modality has its own normalisation (``mean``/``std``) and channel
    order (``bgr_to_rgb``); both share one geometry: the same padding
    (``pad_size_divisor``, right/bottom, up to the largest image of the
    batch) and the same batch augmentations, so a box is valid in both
    images.

    Input (what MMEngine's ``pseudo_collate`` makes of
    ``PackPairedDetInputs`` results)::

        dict(inputs=dict(visible=[uint8 Tensor[3, H_i, W_i], ...],
                         infrared=[uint8 Tensor[3, H_i, W_i], ...]),
             data_samples=[DetDataSample, ...])

    (``default_collate`` style, i.e. a stacked ``Tensor[B, 3, H, W]`` per
    modality, is accepted as well.)

    Output::

        dict(inputs=dict(visible=float Tensor[B, 3, Hp, Wp],
                         infrared=float Tensor[B, 3, Hp, Wp]),
             data_samples=[DetDataSample, ...])

    where ``Hp, Wp`` are the largest ``H, W`` of the batch rounded up to a
    multiple of ``pad_size_divisor``; both modality tensors always have the
    same shape. Every data sample gets ``batch_input_shape = (Hp, Wp)`` and
    its own ``pad_shape`` (its size rounded up to the divisor) in its
    metainfo, as in :class:`mmdet.models.DetDataPreprocessor`; boxes are
    converted from ``BaseBoxes`` to tensors when ``boxtype2tensor``.

    Args:
        visible (dict, optional): Normalisation of the visible images:
            ``mean`` (3 or 1 values), ``std`` and ``bgr_to_rgb``. Defaults to
            ImageNet statistics in RGB order.
        infrared (dict, optional): The same for the infrared images. Defaults
            to the visible settings.
        pad_size_divisor (int): Padded size is a multiple of it. Defaults
            to 1.
        pad_value (Number): Value of padded pixels, after normalisation, in
            both modalities. Defaults to 0.
        boxtype2tensor (bool): Convert ``BaseBoxes`` in the data samples to
            tensors. Defaults to True.
        non_blocking (bool): Non-blocking transfer to the device.
        batch_augments (list[dict], optional): MMDetection batch
            augmentations (e.g. ``BatchSyncRandomResize``,
            ``BatchFixedShapeResize``). They are applied once to the
            channel-wise concatenation of both modalities, so a single random
            draw and a single geometry hold for the pair. An augmentation
            that cannot work on a 6-channel tensor, or that changes the
            number of channels, is refused with an error.
    """

    #: where mmsafe's stack carries the two images and their files, for the
    #: guards (:mod:`mmsafe.modalities`)
    mmsafe_modalities = dict(
        batch_inputs=dict(visible='inputs.visible',
                          infrared='inputs.infrared'),
        model_inputs=dict(visible='inputs.visible',
                          infrared='inputs.infrared'),
        results=dict(visible='img', infrared='ir_img'),
        files=dict(visible='img_path', infrared='ir_img_path'))

    @builds_in_mmsafe_scope
    def __init__(self,
                 visible: Optional[dict] = None,
                 infrared: Optional[dict] = None,
                 pad_size_divisor: int = 1,
                 pad_value: Union[float, int] = 0,
                 boxtype2tensor: bool = True,
                 non_blocking: Optional[bool] = False,
                 batch_augments: Optional[List[dict]] = None) -> None:
        super().__init__(non_blocking)
        default = dict(
            mean=[123.675, 116.28, 103.53],
            std=[58.395, 57.12, 57.375],
            bgr_to_rgb=True)
        visible = dict(default if visible is None else visible)
        infrared = dict(visible if infrared is None else infrared)
        self._bgr_to_rgb = {}
        self._normalize = {}
        for name, cfg in zip(MODALITIES, (visible, infrared)):
            unknown = set(cfg) - {'mean', 'std', 'bgr_to_rgb'}
            if unknown:
                raise MMSafeValueError(
                    f'PairedDetDataPreprocessor.{name} accepts mean, std and '
                    f'bgr_to_rgb, got unknown keys {sorted(unknown)}')
            mean, std = cfg.get('mean'), cfg.get('std')
            if (mean is None) != (std is None):
                raise MMSafeValueError(
                    f'PairedDetDataPreprocessor.{name}: mean and '
                    'std must be both given or both None')
            self._bgr_to_rgb[name] = bool(cfg.get('bgr_to_rgb', False))
            self._normalize[name] = mean is not None
            if mean is not None:
                if len(mean) not in (1, 3) or len(std) not in (1, 3):
                    raise MMSafeValueError(
                        f'PairedDetDataPreprocessor.{name}: mean/std need 1 '
                        f'or 3 values, got {len(mean)} and {len(std)}')
                self.register_buffer(f'{name}_mean',
                                     torch.tensor(mean).view(-1, 1, 1), False)
                self.register_buffer(f'{name}_std',
                                     torch.tensor(std).view(-1, 1, 1), False)
        self.pad_size_divisor = pad_size_divisor
        self.pad_value = pad_value
        self.boxtype2tensor = boxtype2tensor
        if batch_augments is not None:
            self.batch_augments = nn.ModuleList(
                [MODELS.build(aug) for aug in batch_augments])
        else:
            self.batch_augments = None

    @property
    def modality_bgr_to_rgb(self) -> Dict[str, bool]:
        """Whether each modality's channels are reversed (BGR -> RGB), by
        modality name (``'visible'``, ``'infrared'``)."""
        return dict(self._bgr_to_rgb)

    def _convert(self, name: str, img: Tensor) -> Tensor:
        """Channel order, float conversion and normalisation of one
        modality (one image ``[3, H, W]`` or a batch ``[B, 3, H, W]``)."""
        if self._bgr_to_rgb[name]:
            img = img[..., [2, 1, 0], :, :]
        img = img.float()
        if self._normalize[name]:
            mean = getattr(self, f'{name}_mean')
            std = getattr(self, f'{name}_std')
            img = (img - mean) / std
        return img

    def _pad_to(self, size: int) -> int:
        return int(math.ceil(size / self.pad_size_divisor) *
                   self.pad_size_divisor)

    def _check_pairs(self, inputs: Dict, data_samples) -> None:
        missing = [m for m in MODALITIES if m not in inputs]
        if missing:
            raise MMSafeKeyError(
                f'PairedDetDataPreprocessor expects inputs=dict(visible=..., '
                f'infrared=...), missing {missing}; got keys '
                f'{sorted(inputs)}. Use PackPairedDetInputs in the pipeline.')
        vis, ir = inputs['visible'], inputs['infrared']
        if len(vis) != len(ir):
            raise MMSafeValueError(f'Paired batch has {len(vis)} visible and '
                                   f'{len(ir)} infrared images')
        for i, (v, r) in enumerate(zip(vis, ir)):
            if v.shape[-2:] != r.shape[-2:]:
                name = ''
                if data_samples is not None and i < len(data_samples):
                    name = data_samples[i].metainfo.get('img_path', '')
                raise MMSafeValueError(
                    f'Visible and infrared images of sample {i} ({name}) '
                    f'differ in size: {tuple(v.shape[-2:])} vs '
                    f'{tuple(r.shape[-2:])}; paired transforms must keep '
                    'one geometry for both.')

    def forward(self, data: dict, training: bool = False) -> dict:
        """Normalise each modality, pad both alike and set the metainfo.

        Args:
            data (dict): A collated batch (see the class docstring).
            training (bool): Whether batch augmentations apply.

        Returns:
            dict: ``dict(inputs=dict(visible=Tensor, infrared=Tensor),
            data_samples=list)`` as documented in the class docstring.
        """
        data = self.cast_data(data)
        inputs, data_samples = data['inputs'], data.get('data_samples')
        if not isinstance(inputs, dict):
            raise MMSafeTypeError(
                'PairedDetDataPreprocessor expects inputs=dict(visible=..., '
                f'infrared=...), got {type(inputs).__name__}. Use '
                'PackPairedDetInputs in the pipeline.')
        self._check_pairs(inputs, data_samples)

        out = {}
        if is_seq_of(inputs['visible'], Tensor):
            pad_shapes = [(self._pad_to(img.shape[-2]),
                           self._pad_to(img.shape[-1]))
                          for img in inputs['visible']]
            for name in MODALITIES:
                imgs = [self._convert(name, img) for img in inputs[name]]
                out[name] = stack_batch(imgs, self.pad_size_divisor,
                                        self.pad_value)
        elif isinstance(inputs['visible'], Tensor):
            h, w = inputs['visible'].shape[-2:]
            pad_shapes = [(self._pad_to(h), self._pad_to(w))
                          ] * inputs['visible'].shape[0]
            for name in MODALITIES:
                img = self._convert(name, inputs[name])
                ph, pw = pad_shapes[0]
                out[name] = F.pad(img, (0, pw - w, 0, ph - h), 'constant',
                                  self.pad_value)
        else:
            raise MMSafeTypeError(
                'inputs[visible] must be a list of tensors or '
                f'a tensor, got {type(inputs["visible"])}')
        assert out['visible'].shape == out['infrared'].shape

        if data_samples is not None:
            batch_input_shape = tuple(out['visible'].shape[-2:])
            for sample, pad_shape in zip(data_samples, pad_shapes):
                sample.set_metainfo({
                    'batch_input_shape': batch_input_shape,
                    'pad_shape': pad_shape
                })
            if self.boxtype2tensor:
                samplelist_boxtype2tensor(data_samples)

        if training and self.batch_augments is not None:
            out, data_samples = self._batch_augment(out, data_samples)
        return {'inputs': out, 'data_samples': data_samples}

    def _batch_augment(self, inputs: Dict[str, Tensor],
                       data_samples: Sequence) -> Tuple[Dict, Sequence]:
        """Apply each batch augmentation once to both modalities stacked on
        the channel axis: one random draw, one geometry for the pair."""
        num_vis = inputs['visible'].shape[1]
        joint = torch.cat([inputs['visible'], inputs['infrared']], dim=1)
        for aug in self.batch_augments:
            name = type(aug).__name__
            try:
                joint, data_samples = aug(joint, data_samples)
            except Exception as exc:
                raise MMSafeRuntimeError(
                    f'Batch augmentation {name} cannot be applied to a '
                    f'visible+infrared pair (it was given both modalities '
                    f'stacked as one {joint.shape[1]}-channel tensor so that '
                    'they share one random draw). Remove it from '
                    'data_preprocessor.batch_augments or use a '
                    'channel-agnostic (geometric) one.') from exc
            if not isinstance(joint, Tensor) or joint.dim() != 4 or \
                    joint.shape[1] != 2 * num_vis:
                raise MMSafeRuntimeError(
                    f'Batch augmentation {name} changed the stacked pair '
                    f'from {2 * num_vis} channels to '
                    f'{getattr(joint, "shape", None)}; it is not safe for '
                    'visible+infrared pairs.')
        return {
            'visible': joint[:, :num_vis].contiguous(),
            'infrared': joint[:, num_vis:].contiguous()
        }, data_samples

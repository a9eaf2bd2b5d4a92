"""Dual-stream (visible + infrared) Faster R-CNN with optional MACL."""
import contextlib
import copy
from typing import ContextManager, Dict, Optional, Tuple

import torch
from torch import Tensor

from mmdet.models.detectors import TwoStageDetector
from mmsafe.registry import MODELS, builds_in_mmsafe_scope
from mmdet.structures import SampleList
from mmdet.utils import ConfigType, OptConfigType, OptMultiConfig

from mmsafe.compat import autocast_enabled
from mmsafe.errors import MMSafeTypeError, MMSafeValueError
from ..layers.fusion import FusionCfg, build_fusions


@MODELS.register_module()
class DualStreamFasterRCNN(TwoStageDetector):
    """Faster R-CNN on visible + infrared pairs.

    Each modality goes through its own stream (backbone, then neck); the two
    feature pyramids are fused level by level (one fusion module per level)
    and the RPN and RoI heads run on the fused pyramid. A ``macl_head``
    (:class:`MACLHead`) adds ``loss_macl`` between the two streams' features
    during training.

    Inputs are what :class:`PairedDetDataPreprocessor` returns:
    ``dict(visible=Tensor[B, 3, H, W], infrared=Tensor[B, 3, H, W])``.

    Precision under CPU autocast (``AmpNaNSkipOptimWrapper`` on CPU): the
    streams, the fusion and the MACL head run under autocast (bfloat16 or
    float16); the RPN and RoI heads always run in float32 with autocast
    disabled, on the fused features cast to float32. mmcv's CPU kernels
    (NMS, RoIAlign, RoIPool) take float32 only, and the heads around them
    then compute in the same precision as the ops. On CUDA, and without
    autocast, nothing is cast.

    Args:
        backbone (dict): Visible backbone config.
        neck (dict, optional): Neck config of the visible stream.
        rpn_head (dict, optional): RPN head config.
        roi_head (dict, optional): RoI head config.
        train_cfg (dict, optional): Training config (``rpn``,
            ``rpn_proposal``, ``rcnn``).
        test_cfg (dict, optional): Testing config (``rpn``, ``rcnn``).
        ir_backbone (dict, optional): Infrared backbone config; None shares
            the visible backbone's weights. Defaults to None.
        ir_neck (dict, optional): Infrared neck config; None shares the
            visible neck's weights. Defaults to None.
        fusion (dict | list[dict]): Fusion module config, e.g.
            ``dict(type='ConcatConvFusion')``, ``dict(type='AddFusion')`` or
            ``dict(type='WeightedAddFusion')``; a dict is built once per
            level (``in_channels`` is filled from ``neck.out_channels`` when
            the module takes it), a list gives one config per level.
        num_fusion_levels (int, optional): Number of feature levels; defaults
            to ``neck.num_outs``, or the length of ``backbone.out_indices``
            without a neck.
        macl_head (dict, optional): :class:`MACLHead` config; None disables
            the contrastive loss.
        data_preprocessor (dict, optional): Normally
            ``dict(type='PairedDetDataPreprocessor', ...)``.
        init_cfg (dict, optional): Initialisation config.
        channels_last (bool): Keep the convolution weights and both image
            batches in the channels-last (NHWC) memory layout, which
            cuDNN's tensor-core convolutions run natively. The same
            values and parameters, laid out differently in memory: weights
            initialised or loaded later keep the layout, checkpoints load
            into a model with either setting. Defaults to False.
    """

    @builds_in_mmsafe_scope
    def __init__(self,
                 backbone: ConfigType,
                 neck: OptConfigType = None,
                 rpn_head: OptConfigType = None,
                 roi_head: OptConfigType = None,
                 train_cfg: OptConfigType = None,
                 test_cfg: OptConfigType = None,
                 ir_backbone: OptConfigType = None,
                 ir_neck: OptConfigType = None,
                 fusion: FusionCfg = dict(type='ConcatConvFusion'),
                 num_fusion_levels: Optional[int] = None,
                 macl_head: OptConfigType = None,
                 data_preprocessor: OptConfigType = None,
                 init_cfg: OptMultiConfig = None,
                 channels_last: bool = False) -> None:
        super().__init__(
            backbone=backbone,
            neck=neck,
            rpn_head=rpn_head,
            roi_head=roi_head,
            train_cfg=train_cfg,
            test_cfg=test_cfg,
            data_preprocessor=data_preprocessor,
            init_cfg=init_cfg)
        self.ir_backbone = (MODELS.build(ir_backbone)
                            if ir_backbone is not None else None)
        if ir_neck is not None and neck is None:
            raise MMSafeValueError(
                'DualStreamFasterRCNN: ir_neck is set but neck '
                'is None')
        self.ir_neck = MODELS.build(ir_neck) if ir_neck is not None else None
        self.fusions = build_fusions(fusion, num_fusion_levels, backbone,
                                     neck)
        self.macl_head = None
        if macl_head is not None:
            out_channels = neck.get('out_channels') if neck else None
            in_dim = macl_head.get('in_dim', 256)
            if isinstance(out_channels, int) and in_dim != out_channels:
                raise MMSafeValueError(
                    f'macl_head.in_dim={in_dim} does not match the '
                    f'{out_channels}-channel features of '
                    f'neck.out_channels={out_channels}: set macl_head.in_dim='
                    f'{out_channels}.')
            self.macl_head = MODELS.build(macl_head)
        self.channels_last = bool(channels_last)
        if self.channels_last:
            # before any wrapper (DDP) holds the parameters: only the
            # layout of the 4-D weights changes, in place of the data of
            # the same Parameter objects
            self.to(memory_format=torch.channels_last)

    def init_weights(self) -> None:
        """MMEngine's initialisation; with ``channels_last`` the random
        draws are made in the default layout and copied into the
        channels-last weights, so that a seed gives the same values with
        either setting (and the weights keep their storage: a DDP wrapper
        built before this call still holds them)."""
        if not self.channels_last:
            return super().init_weights()
        kept = {p: p.data for p in self.parameters() if p.dim() == 4}
        for param, data in kept.items():
            param.data = data.contiguous()
        try:
            super().init_weights()
        finally:
            for param, data in kept.items():
                data.copy_(param.data)
                param.data = data

    @property
    def shares_backbone(self) -> bool:
        """Whether both modalities use the same backbone weights."""
        return self.ir_backbone is None

    @property
    def with_macl(self) -> bool:
        """Whether the detector has a MACL head."""
        return self.macl_head is not None

    @staticmethod
    def _split_inputs(batch_inputs: Dict[str, Tensor]) -> Tuple[Tensor,
                                                                Tensor]:
        if not isinstance(batch_inputs, dict) or not {
                'visible', 'infrared'} <= set(batch_inputs):
            got = (sorted(batch_inputs) if isinstance(batch_inputs, dict)
                   else type(batch_inputs).__name__)
            raise MMSafeTypeError(
                'DualStreamFasterRCNN expects inputs=dict(visible=Tensor, '
                f'infrared=Tensor) (PairedDetDataPreprocessor), got {got}')
        return batch_inputs['visible'], batch_inputs['infrared']

    def extract_paired_feat(
            self, batch_inputs: Dict[str, Tensor]
    ) -> Tuple[Tuple[Tensor, ...], Tuple[Tensor, ...]]:
        """Per-modality feature pyramids (before fusion).

        Args:
            batch_inputs (dict): ``visible`` and ``infrared`` image batches.

        Returns:
            tuple: visible features and infrared features, each a tuple of
            ``[B, C, H, W]`` tensors, one per level.
        """
        vis, ir = self._split_inputs(batch_inputs)
        if self.channels_last:
            vis = vis.contiguous(memory_format=torch.channels_last)
            ir = ir.contiguous(memory_format=torch.channels_last)
        vis_feats = self.backbone(vis)
        ir_backbone = self.backbone if self.shares_backbone else \
            self.ir_backbone
        ir_feats = ir_backbone(ir)
        if self.with_neck:
            ir_neck = self.neck if self.ir_neck is None else self.ir_neck
            vis_feats = self.neck(vis_feats)
            ir_feats = ir_neck(ir_feats)
        return tuple(vis_feats), tuple(ir_feats)

    def fuse(self, vis_feats: Tuple[Tensor, ...],
             ir_feats: Tuple[Tensor, ...]) -> Tuple[Tensor, ...]:
        """Fuse the two pyramids level by level."""
        if not len(vis_feats) == len(ir_feats) == len(self.fusions):
            raise MMSafeValueError(
                f'DualStreamFasterRCNN has {len(self.fusions)} fusion modules '
                f'but got {len(vis_feats)} visible and {len(ir_feats)} '
                'infrared feature levels; set num_fusion_levels to match.')
        return tuple(
            fusion(v, r)
            for fusion, v, r in zip(self.fusions, vis_feats, ir_feats))

    def extract_feat(self, batch_inputs: Dict[str, Tensor]) -> Tuple[Tensor]:
        """Fused multi-level features of a paired batch."""
        return self.fuse(*self.extract_paired_feat(batch_inputs))

    @staticmethod
    def _head_precision(
            x: Tuple[Tensor, ...]
    ) -> Tuple[Tuple[Tensor, ...], ContextManager]:
        """The features for the RPN/RoI heads and the autocast context to
        run them in: float32 with CPU autocast disabled when CPU autocast is
        on (see the class docstring), else ``x`` unchanged and no context.
        """
        if not (x and x[0].device.type == 'cpu'
                and autocast_enabled('cpu')):
            return x, contextlib.nullcontext()
        return (tuple(f.float() for f in x),
                torch.autocast('cpu', enabled=False))

    def loss(self, batch_inputs: Dict[str, Tensor],
             batch_data_samples: SampleList) -> dict:
        """RPN and RoI losses on the fused features, plus ``loss_macl``.

        Args:
            batch_inputs (dict): ``visible`` and ``infrared`` batches.
            batch_data_samples (list[DetDataSample]): Annotations and
                metainfo.

        Returns:
            dict: ``loss_rpn_cls``, ``loss_rpn_bbox``, ``loss_cls``,
            ``loss_bbox``, ``acc`` and, with a MACL head, ``loss_macl`` and
            ``macl_temperature``.
        """
        vis_feats, ir_feats = self.extract_paired_feat(batch_inputs)
        x, precision = self._head_precision(self.fuse(vis_feats, ir_feats))
        with precision:
            losses = self._head_losses(x, batch_data_samples)
        if self.with_macl:
            losses.update(
                self.macl_head.loss(vis_feats, ir_feats, batch_data_samples))
        return losses

    def _proposals(self, x: Tuple[Tensor], batch_data_samples: SampleList
                   ) -> list:
        if batch_data_samples[0].get('proposals', None) is None:
            return self.rpn_head.predict(x, batch_data_samples, rescale=False)
        return [sample.proposals for sample in batch_data_samples]

    def predict(self,
                batch_inputs: Dict[str, Tensor],
                batch_data_samples: SampleList,
                rescale: bool = True) -> SampleList:
        """Detections of :meth:`TwoStageDetector.predict` on the fused
        features (heads in the precision of the class docstring)."""
        assert self.with_bbox, "Bbox head must be implemented."
        x, precision = self._head_precision(self.extract_feat(batch_inputs))
        with precision:
            results_list = self.roi_head.predict(
                x, self._proposals(x, batch_data_samples),
                batch_data_samples, rescale=rescale)
        return self.add_pred_to_datasample(batch_data_samples, results_list)

    def _forward(self, batch_inputs: Dict[str, Tensor],
                 batch_data_samples: SampleList) -> tuple:
        """Raw RoI head outputs (``mode='tensor'``)."""
        x, precision = self._head_precision(self.extract_feat(batch_inputs))
        with precision:
            return (self.roi_head.forward(
                x, self._proposals(x, batch_data_samples),
                batch_data_samples), )

    def _head_losses(self, x: Tuple[Tensor], batch_data_samples: SampleList
                     ) -> dict:
        """The losses of :meth:`TwoStageDetector.loss`, from features."""
        losses = dict()
        if self.with_rpn:
            proposal_cfg = self.train_cfg.get('rpn_proposal',
                                              self.test_cfg.rpn)
            rpn_data_samples = copy.deepcopy(batch_data_samples)
            # The RPN is class-agnostic: every box is label 0 for it.
            for data_sample in rpn_data_samples:
                data_sample.gt_instances.labels = torch.zeros_like(
                    data_sample.gt_instances.labels)
            rpn_losses, rpn_results_list = self.rpn_head.loss_and_predict(
                x, rpn_data_samples, proposal_cfg=proposal_cfg)
            for key in list(rpn_losses):
                if 'loss' in key and 'rpn' not in key:
                    rpn_losses[f'rpn_{key}'] = rpn_losses.pop(key)
            losses.update(rpn_losses)
        else:
            assert batch_data_samples[0].get('proposals', None) is not None
            rpn_results_list = [
                data_sample.proposals for data_sample in batch_data_samples
            ]
        losses.update(
            self.roi_head.loss(x, rpn_results_list, batch_data_samples))
        return losses

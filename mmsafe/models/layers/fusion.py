"""Fusion of visible and infrared feature maps of one pyramid level."""
import copy
import inspect
from typing import List, Optional, Union

import torch
import torch.nn as nn
from mmengine.model import BaseModule, ModuleList
from torch import Tensor

from mmsafe.registry import MODELS
from mmdet.utils import ConfigType, OptConfigType, OptMultiConfig
from mmsafe.errors import MMSafeValueError

FusionCfg = Union[ConfigType, List[ConfigType]]


def _check_shapes(vis: Tensor, ir: Tensor, name: str) -> None:
    if vis.shape != ir.shape:
        raise MMSafeValueError(
            f'{name}: visible and infrared features differ in shape: '
            f'{tuple(vis.shape)} vs {tuple(ir.shape)}')


@MODELS.register_module()
class ConcatConvFusion(BaseModule):
    """Concatenate both modalities on the channel axis, then a 1x1 conv.

    Args:
        in_channels (int): Channels of each modality's feature map.
        out_channels (int, optional): Output channels. Defaults to
            ``in_channels`` (what the RPN and RoI heads expect).
        act (bool): Apply ReLU after the conv. Defaults to False, so the
            fused map has the same value range as an FPN output.
        init_cfg (dict, optional): Initialisation config.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int = None,
                 act: bool = False,
                 init_cfg: OptMultiConfig = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.in_channels = in_channels
        self.out_channels = out_channels or in_channels
        self.conv = nn.Conv2d(2 * in_channels, self.out_channels, 1)
        self.act = nn.ReLU(inplace=True) if act else nn.Identity()

    def init_weights(self) -> None:
        super().init_weights()
        if self.init_cfg is None and self.out_channels == self.in_channels:
            # Start as the mean of both modalities: the heads see sensible
            # features from the first iteration, whatever the init of the
            # streams, and the conv learns to weight them from there.
            eye = torch.eye(self.in_channels) * 0.5
            with torch.no_grad():
                self.conv.weight.copy_(
                    torch.cat([eye, eye], dim=1)[:, :, None, None])
                self.conv.bias.zero_()

    def forward(self, vis: Tensor, ir: Tensor) -> Tensor:
        _check_shapes(vis, ir, type(self).__name__)
        if vis.shape[1] != self.in_channels:
            raise MMSafeValueError(
                f'ConcatConvFusion.in_channels={self.in_channels} but the '
                f'features have {vis.shape[1]} channels')
        return self.act(self.conv(torch.cat([vis, ir], dim=1)))


@MODELS.register_module()
class AddFusion(BaseModule):
    """Element-wise sum of both modalities, optionally weighted.

    Args:
        weighted (bool): Learn two scalar weights (softmax-normalised, so
            the result is a convex combination). Defaults to False (plain
            sum, no parameters).
        init_cfg (dict, optional): Initialisation config.
    """

    def __init__(self,
                 weighted: bool = False,
                 init_cfg: OptMultiConfig = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.weighted = weighted
        if weighted:
            self.logits = nn.Parameter(torch.zeros(2))

    def forward(self, vis: Tensor, ir: Tensor) -> Tensor:
        _check_shapes(vis, ir, type(self).__name__)
        if not self.weighted:
            return vis + ir
        w = self.logits.softmax(dim=0)
        return w[0] * vis + w[1] * ir


@MODELS.register_module()
class WeightedAddFusion(AddFusion):
    """:class:`AddFusion` with learnable, softmax-normalised weights."""

    def __init__(self, init_cfg: OptMultiConfig = None) -> None:
        super().__init__(weighted=True, init_cfg=init_cfg)


def _accepts(cfg: dict, arg: str) -> bool:
    """Whether the registered class of ``cfg`` takes an ``arg`` argument."""
    cls = cfg['type'] if inspect.isclass(cfg['type']) else MODELS.get(
        cfg['type'])
    if cls is None:
        return False
    return arg in inspect.signature(cls.__init__).parameters


def build_fusions(fusion: FusionCfg, num_levels: Optional[int],
                  backbone: ConfigType, neck: OptConfigType) -> ModuleList:
    """One fusion module per feature level.

    Args:
        fusion (dict | list[dict]): One config for every level, or a list
            of one config per level. ``in_channels`` is filled from
            ``neck.out_channels`` when the module takes it.
        num_levels (int, optional): Number of levels; defaults to
            ``neck.num_outs``, or the length of ``backbone.out_indices``
            without a neck.
        backbone (dict): Backbone config.
        neck (dict, optional): Neck config.

    Returns:
        ModuleList: the fusion modules, in level order.
    """
    if isinstance(fusion, (list, tuple)):
        cfgs = [copy.deepcopy(dict(f)) for f in fusion]
        if num_levels is not None and num_levels != len(cfgs):
            raise MMSafeValueError(
                f'num_fusion_levels={num_levels} but {len(cfgs)} fusion '
                'configs were given')
    else:
        if num_levels is None:
            if neck is not None and 'num_outs' in neck:
                num_levels = neck['num_outs']
            elif neck is None and 'out_indices' in backbone:
                num_levels = len(backbone['out_indices'])
            else:
                raise MMSafeValueError(
                    'DualStreamFasterRCNN cannot infer the number of '
                    'feature levels to fuse: set num_fusion_levels or '
                    'give a list of fusion configs.')
        cfgs = [copy.deepcopy(dict(fusion)) for _ in range(num_levels)]
    channels = neck.get('out_channels') if neck is not None else None
    for cfg in cfgs:
        if ('in_channels' not in cfg and isinstance(channels, int)
                and _accepts(cfg, 'in_channels')):
            cfg['in_channels'] = channels
    # mmengine's ModuleList, so that init_weights reaches the modules.
    return ModuleList([MODELS.build(cfg) for cfg in cfgs])

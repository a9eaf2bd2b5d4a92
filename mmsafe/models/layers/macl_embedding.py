"""Building blocks of the MACL embedding: level selection, global pooling,
the projector and the running feature centres."""
from typing import Optional, Sequence

import torch
import torch.distributed as torch_dist
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from mmsafe.errors import MMSafeIndexError, MMSafeValueError


def select_level(feats: Sequence[Tensor], level: int, in_dim: int,
                 name: str) -> Tensor:
    """The ``[B, in_dim, H, W]`` map at index ``level`` of ``feats``.

    Raises:
        IndexError: ``level`` is out of range for ``feats``.
        ValueError: the map is not 4-D or has other than ``in_dim``
            channels (the message names the config key to fix).
    """
    if isinstance(feats, Tensor):
        feats = (feats, )
    num_levels = len(feats)
    if not -num_levels <= level < num_levels:
        raise MMSafeIndexError(
            f'MACLHead.feature_level={level} is out of range for the '
            f'{num_levels} {name} feature levels')
    feat = feats[level]
    if feat.dim() != 4:
        raise MMSafeValueError(
            f'MACLHead expects {name} feature maps of shape '
            f'[B, C, H, W], got {tuple(feat.shape)}')
    if feat.shape[1] != in_dim:
        raise MMSafeValueError(
            f'MACLHead.in_dim={in_dim} does not match the {name} features '
            f'at feature_level={level}, which have {feat.shape[1]} '
            f'channels: set macl_head.in_dim={feat.shape[1]} (or pick '
            'another feature_level).')
    return feat


def global_pool(feat: Tensor, pooling: str) -> Tensor:
    """``[B, C, H, W]`` -> ``[B, C]`` by ``'avg'`` or ``'max'`` pooling."""
    if pooling == 'avg':
        return F.adaptive_avg_pool2d(feat, 1).flatten(1)
    return F.adaptive_max_pool2d(feat, 1).flatten(1)


def make_projector(in_dim: int, hidden_dim: int, proj_dim: int,
                   norm: Optional[str]) -> nn.Sequential:
    """``Linear -> [LayerNorm] -> ReLU -> Linear`` (no BatchNorm, so a
    batch of one works)."""
    layers = [nn.Linear(in_dim, hidden_dim)]
    if norm == 'LN':
        layers.append(nn.LayerNorm(hidden_dim))
    layers += [nn.ReLU(inplace=True), nn.Linear(hidden_dim, proj_dim)]
    return nn.Sequential(*layers)


@torch.no_grad()
def update_centers_(vis_center: Tensor, ir_center: Tensor, vis: Tensor,
                    ir: Tensor, momentum: float, started: bool,
                    all_reduce: bool) -> bool:
    """EMA update, in place, of the per-modality centres of pooled features.

    The first update (``started=False``) sets the centres to the batch
    mean; later ones keep ``momentum`` of the old centre. With
    ``all_reduce`` the batch sums are reduced over all ranks first, so every
    rank computes the same centres. A batch without pairs (on every rank,
    with ``all_reduce``) leaves the centres unchanged.

    Returns:
        bool: whether the centres were updated (the caller counts updates
        and passes ``started=True`` from then on).
    """
    sums = torch.cat([vis.sum(0), ir.sum(0),
                      vis.new_full((1, ), vis.shape[0])])
    if all_reduce:
        torch_dist.all_reduce(sums)
    if not started and not vis.shape[0]:
        return False
    count = sums[-1:]
    m = momentum if started else 0.
    scale = torch.where(count > 0, 1 - m, 0.) / count.clamp(min=1)
    keep = torch.where(count > 0, m, 1.)
    dim = vis_center.shape[0]
    vis_center.mul_(keep).add_(sums[:dim] * scale)
    ir_center.mul_(keep).add_(sums[dim:2 * dim] * scale)
    return True

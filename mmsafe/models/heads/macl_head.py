"""MACL: modality-aligned contrastive loss between visible and infrared."""
import logging
import math
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.dist import get_rank, get_world_size
from mmengine.model import BaseModule
from torch import Tensor

from mmsafe.registry import MODELS
from mmdet.utils import OptMultiConfig

from mmsafe.errors import MMSafeValueError
from mmsafe.events import log, update_counters
from mmsafe.guard_outputs import CounterKey, GuardOutputs, Section
from ..layers.contrastive import (contrastive_logs, pair_gap,
                                  symmetric_info_nce)
from ..layers.gather import gather_rows
from ..layers.macl_embedding import (global_pool, make_projector,
                                     select_level, update_centers_)
from ..utils import connected_zero


@MODELS.register_module()
class MACLHead(BaseModule):
    """Cross-modal InfoNCE between the visible and infrared images of pairs.

    Each modality's feature map at ``feature_level`` is globally pooled,
    projected (``Linear -> LayerNorm -> ReLU -> Linear``; no BatchNorm, so a
    batch of one works) and L2-normalised. For pair ``i`` the positive of
    its visible embedding is its own infrared embedding; the infrared
    embeddings of the other pairs are the negatives (and symmetrically from
    infrared to visible). The loss is
    ``loss_weight * (CE(v @ r.T / t) + CE(r @ v.T / t)) / 2`` with a
    learnable temperature ``t = exp(log_temperature)`` clamped to
    ``[min_temperature, max_temperature]``. At chance level it equals
    ``ln(B)``, ``B`` being the number of candidates each query is compared
    with (:attr:`last_num_pairs`).

    With fewer than two candidates (fewer than 2 pairs on this rank, or in
    all ranks together with ``gather_negatives``) there is nothing to
    contrast: ``loss_macl`` is then a zero connected to every parameter of
    the head (so DDP gets a gradient for each of them), the event is counted
    in the message hub under ``mmsafe/macl`` (``small_batches``) and logged
    once. The key is always present and nothing is ever swallowed: a
    configuration error (``in_dim`` or ``feature_level`` that do not match
    the features) raises at the first iteration.

    Args:
        in_dim (int): Channels of the feature level used; checked against
            the real features.
        proj_dim (int): Embedding size. Defaults to 128.
        hidden_dim (int, optional): Hidden size of the projector. Defaults
            to ``in_dim``.
        feature_level (int): Index of the level in the per-modality feature
            tuple (FPN outputs, or backbone outputs without a neck);
            negative indices count from the end. Defaults to -1.
        pooling (str): ``'avg'`` or ``'max'`` global pooling.
        center_momentum (float, optional): Subtract from each modality's
            pooled features their running mean (an EMA with this momentum,
            updated in training; a buffer, so it works at any batch size,
            even 1). Pooled feature maps of different images share a large
            common component; without centring their embeddings start
            nearly identical and the loss sits at ``ln(B)``. None disables
            it. Defaults to 0.9.
        norm (str, optional): ``'LN'`` (LayerNorm) or None in the projector.
        shared_projector (bool): One projector for both modalities instead
            of one each. Defaults to False.
        init_temperature (float): Initial temperature. Defaults to 0.1.
        min_temperature (float): Lower clamp. Defaults to 0.01.
        max_temperature (float): Upper clamp. Defaults to 1.0.
        learnable_temperature (bool): Learn the temperature. Defaults to
            True.
        gather_negatives (bool): All-gather embeddings from all ranks so
            that the other ranks' pairs are negatives too. Gradients flow
            back to the rank that produced each embedding, and the centring
            statistics are reduced over all ranks (one more all-reduce), so
            2 ranks with B pairs each compute exactly the loss and the
            gradients of one process with 2B pairs. Without it each rank
            contrasts its own pairs and keeps its own centres (as BatchNorm
            without SyncBN). Defaults to False.
        loss_weight (float): Weight of the loss. Defaults to 0.1.
        init_cfg (dict, optional): Initialisation config.
    """

    guard_outputs = GuardOutputs(Section.MACL_CHECK,
                                 counters=(CounterKey.MACL, ))

    #: the pairing-sensitive term this head adds, for the guards
    #: (:mod:`mmsafe.modalities`): its weight is the head's ``loss_weight``
    mmsafe_modalities = dict(losses=['loss_macl'], chance='loss_macl')

    def __init__(self,
                 in_dim: int = 256,
                 proj_dim: int = 128,
                 hidden_dim: Optional[int] = None,
                 feature_level: int = -1,
                 pooling: str = 'avg',
                 center_momentum: Optional[float] = 0.9,
                 norm: Optional[str] = 'LN',
                 shared_projector: bool = False,
                 init_temperature: float = 0.1,
                 min_temperature: float = 0.01,
                 max_temperature: float = 1.0,
                 learnable_temperature: bool = True,
                 gather_negatives: bool = False,
                 loss_weight: float = 0.1,
                 init_cfg: OptMultiConfig = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if pooling not in ('avg', 'max'):
            raise MMSafeValueError(
                f"MACLHead.pooling must be 'avg' or 'max', got "
                f'{pooling!r}')
        if norm not in ('LN', None):
            raise MMSafeValueError(
                "MACLHead.norm must be 'LN' or None (BatchNorm "
                f'breaks at batch size 1), got {norm!r}')
        if not 0 < min_temperature <= init_temperature <= max_temperature:
            raise MMSafeValueError(
                'MACLHead needs 0 < min_temperature <= init_temperature <= '
                f'max_temperature, got {min_temperature}, '
                f'{init_temperature}, {max_temperature}')
        self.in_dim = in_dim
        self.proj_dim = proj_dim
        self.hidden_dim = hidden_dim or in_dim
        self.feature_level = feature_level
        self.pooling = pooling
        if center_momentum is not None and not 0 <= center_momentum < 1:
            raise MMSafeValueError(
                'MACLHead.center_momentum must be in [0, 1) or '
                f'None, got {center_momentum}')
        self.center_momentum = center_momentum
        if center_momentum is not None:
            self.register_buffer('vis_center', torch.zeros(in_dim))
            self.register_buffer('ir_center', torch.zeros(in_dim))
            self.register_buffer('num_center_updates',
                                 torch.zeros((), dtype=torch.long))
        self.min_temperature = min_temperature
        self.max_temperature = max_temperature
        self.gather_negatives = gather_negatives
        self.loss_weight = loss_weight

        self.vis_projector = make_projector(in_dim, self.hidden_dim,
                                            proj_dim, norm)
        self.ir_projector = (
            self.vis_projector if shared_projector else make_projector(
                in_dim, self.hidden_dim, proj_dim, norm))
        log_t = torch.tensor(math.log(init_temperature))
        if learnable_temperature:
            self.log_temperature = nn.Parameter(log_t)
        else:
            self.register_buffer('log_temperature', log_t)

        #: Number of candidates per query in the latest contrast (chance
        #: level of the loss is ln of it); 0 before the first call.
        self.last_num_pairs = 0
        self.num_calls = 0
        self.num_small_batches = 0
        self._center_started: Optional[bool] = None

    @property
    def temperature(self) -> Tensor:
        """The clamped temperature."""
        return self.log_temperature.exp().clamp(self.min_temperature,
                                                self.max_temperature)

    @torch.no_grad()
    def _update_centers(self, vis: Tensor, ir: Tensor) -> None:
        if self.center_momentum is None or not self.training:
            return
        if self._center_started is None:
            # Read once (a resumed run continues its centres).
            self._center_started = bool(self.num_center_updates > 0)
        if update_centers_(
                self.vis_center, self.ir_center, vis, ir,
                self.center_momentum, self._center_started,
                all_reduce=self.gather_negatives and get_world_size() > 1):
            self.num_center_updates += 1
            self._center_started = True

    def _embed(self, pooled: Tensor, projector: nn.Module,
               center: Optional[Tensor]) -> Tensor:
        if center is not None:
            pooled = pooled - center
        return F.normalize(projector(pooled), dim=1)

    def embed(self, vis_feat: Tensor, ir_feat: Tensor) -> Tuple[Tensor,
                                                                Tensor]:
        """Pool, centre, project and L2-normalise both modalities.

        Args:
            vis_feat (Tensor): Visible feature maps ``[B, C, H, W]``.
            ir_feat (Tensor): Infrared feature maps ``[B, C, H, W]``.

        Returns:
            tuple[Tensor]: ``[B, proj_dim]`` unit embeddings per modality.
        """
        vis = global_pool(vis_feat, self.pooling)
        ir = global_pool(ir_feat, self.pooling)
        self._update_centers(vis, ir)
        centered = self.center_momentum is not None
        return (self._embed(vis, self.vis_projector,
                            self.vis_center if centered else None),
                self._embed(ir, self.ir_projector,
                            self.ir_center if centered else None))

    def loss(self,
             vis_feats: Sequence[Tensor],
             ir_feats: Sequence[Tensor],
             batch_data_samples: Optional[Sequence] = None
             ) -> Dict[str, Tensor]:
        """Compute ``loss_macl``.

        Args:
            vis_feats (tuple[Tensor]): Per-level visible features
                ``[B, C, H, W]``.
            ir_feats (tuple[Tensor]): Per-level infrared features, same
                shapes.
            batch_data_samples (list, optional): Only used to name the files
                in log lines.

        Returns:
            dict: ``loss_macl`` (always present, weighted), and for
            logging only (they do not enter the total loss):
            ``macl_temperature``; when at least 2 candidates were
            contrasted, ``macl_infonce`` (the unweighted InfoNCE) and
            ``macl_chance_ratio`` (``macl_infonce`` / ln(B), B the number
            of candidates: 1.0 means the embeddings carry no pairing
            information); when this rank holds at least 2 pairs,
            ``macl_pair_gap`` (mean cosine similarity of the true pairs
            minus that of mismatched pairs).
        """
        vis = select_level(vis_feats, self.feature_level, self.in_dim,
                           'visible')
        ir = select_level(ir_feats, self.feature_level, self.in_dim,
                          'infrared')
        if vis.shape[0] != ir.shape[0]:
            raise MMSafeValueError(f'MACLHead got {vis.shape[0]} visible and '
                                   f'{ir.shape[0]} infrared feature maps')
        num_local = vis.shape[0]
        vis_emb, ir_emb = self.embed(vis, ir)

        offset, num_keys = 0, num_local
        vis_keys, ir_keys = vis_emb, ir_emb
        if self.gather_negatives:
            # Always called, whatever num_local: every rank must join.
            joint, offset, num_keys = gather_rows(
                torch.cat([vis_emb, ir_emb], dim=1))
            vis_keys, ir_keys = joint.split(self.proj_dim, dim=1)

        self.num_calls += 1
        self.last_num_pairs = num_keys
        temperature = self.temperature
        logged: Dict[str, Tensor] = {}
        if num_local < 1 or num_keys < 2:
            loss = connected_zero(self.parameters(), vis, ir, vis_emb,
                                  ir_emb)
            self.num_small_batches += 1
            if self.num_small_batches == 1:
                names = []
                for sample in batch_data_samples or []:
                    names.append(sample.metainfo.get('img_path'))
                log(f'MACL got {num_keys} pair(s) to contrast on rank '
                    f'{get_rank()} (files: {names}); loss_macl is a '
                    'connected zero for such batches (counted under '
                    'mmsafe/macl.small_batches, logged once). Avoid it with '
                    'train_dataloader.batch_size>=2 and drop_last=True, or '
                    'macl_head.gather_negatives=True under DDP.',
                    logging.WARNING)
        else:
            loss = symmetric_info_nce(vis_emb, ir_emb, vis_keys, ir_keys,
                                      offset, temperature)
            logged.update(contrastive_logs(loss, num_keys))
            loss = self.loss_weight * loss
        if num_local >= 2:
            logged['macl_pair_gap'] = pair_gap(vis_emb, ir_emb)
        update_counters(
            CounterKey.MACL,
            calls=self.num_calls,
            small_batches=self.num_small_batches,
            last_num_pairs=self.last_num_pairs)
        return dict(loss_macl=loss, macl_temperature=temperature.detach(),
                    **logged)

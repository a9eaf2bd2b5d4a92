"""Cross-modal contrastive terms between paired embeddings."""
import math
from typing import Dict

import torch
import torch.nn.functional as F
from torch import Tensor


def symmetric_info_nce(vis_emb: Tensor, ir_emb: Tensor, vis_keys: Tensor,
                       ir_keys: Tensor, offset: int,
                       temperature: Tensor) -> Tensor:
    """InfoNCE from visible to infrared and back, averaged.

    Query ``i`` (a row of ``vis_emb``/``ir_emb``) has its positive at row
    ``offset + i`` of the other modality's keys; every other key is a
    negative. At chance level the result equals ``ln(len(keys))``.

    Args:
        vis_emb (Tensor): ``[B, D]`` visible queries (unit rows).
        ir_emb (Tensor): ``[B, D]`` infrared queries.
        vis_keys (Tensor): ``[K, D]`` visible keys (``K >= B``).
        ir_keys (Tensor): ``[K, D]`` infrared keys.
        offset (int): Row of the first query's positive in the keys.
        temperature (Tensor): Softmax temperature.

    Returns:
        Tensor: the unweighted loss (a scalar).
    """
    labels = torch.arange(vis_emb.shape[0], device=vis_emb.device) + offset
    logits_v2i = vis_emb @ ir_keys.t() / temperature
    logits_i2v = ir_emb @ vis_keys.t() / temperature
    return 0.5 * (F.cross_entropy(logits_v2i, labels) +
                  F.cross_entropy(logits_i2v, labels))


def chance_ratio(info_nce: Tensor, num_keys: int) -> Tensor:
    """``info_nce / ln(num_keys)``: 1.0 when the embeddings carry no pairing
    information (``num_keys >= 2``)."""
    return info_nce / math.log(num_keys)


@torch.no_grad()
def pair_gap(vis_emb: Tensor, ir_emb: Tensor) -> Tensor:
    """Shuffled-pair control: mean cosine similarity of the true pairs
    minus that of mismatched pairs (each visible embedding against its
    neighbour's infrared one); about 0 when pairing is broken. Needs at
    least 2 rows."""
    true_sim = (vis_emb * ir_emb).sum(1).mean()
    rolled = (vis_emb * ir_emb.roll(1, dims=0)).sum(1).mean()
    return true_sim - rolled


def contrastive_logs(loss: Tensor, num_keys: int) -> Dict[str, Tensor]:
    """The logged (detached) views of an unweighted InfoNCE value."""
    loss = loss.detach()
    return dict(macl_infonce=loss,
                macl_chance_ratio=chance_ratio(loss, num_keys))

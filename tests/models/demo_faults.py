"""Faults for the demo detector under DDP (imported by the training
subprocess through ``custom_imports``)."""
from typing import Optional

from mmengine.dist import get_rank
from mmengine.logging import MessageHub

from mmdet.registry import MODELS
from mmsafe.models.heads.macl_head import MACLHead


@MODELS.register_module()
class VanishingMACLHead(MACLHead):
    """``MACLHead`` whose ``loss_macl`` leaves the loss dict on
    ``vanish_rank`` from training iteration ``vanish_at`` on (1-based), as
    when an exception around it is caught and dropped."""

    def __init__(self, vanish_rank: Optional[int] = None, vanish_at: int = 1,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.vanish_rank = vanish_rank
        self.vanish_at = vanish_at

    def loss(self, *args, **kwargs):
        losses = super().loss(*args, **kwargs)
        done = MessageHub.get_current_instance().get_info('iter', 0)
        if done + 1 >= self.vanish_at and get_rank() == self.vanish_rank:
            return {}
        return losses

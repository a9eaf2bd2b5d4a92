"""Small helpers shared by mmsafe's hooks and optimizer wrappers."""
import torch.nn as nn


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside an MMEngine model wrapper (DDP, ...), or ``model``."""
    from mmengine.model import is_model_wrapper
    return model.module if is_model_wrapper(model) else model

"""Small helpers shared by mmsafe's hooks and optimizer wrappers."""
import torch.nn as nn


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside an MMEngine model wrapper (DDP, ...), or ``model``."""
    from mmengine.model import is_model_wrapper
    return model.module if is_model_wrapper(model) else model


def train_progress(runner) -> tuple:
    """``(epoch, iter, max_iters)`` of the training loop, without building
    it: in a run that only evaluates (``tools/test.py``, ``runner.val()``)
    MMEngine's ``runner.iter`` would build the training loop, hence the
    training dataset, just to read 0. There the message hub's values are
    given (None when it holds none). ``iter`` counts the completed
    training iterations."""
    from mmengine.runner import BaseLoop
    loop = getattr(runner, '_train_loop', None)
    if isinstance(loop, BaseLoop):
        return loop.epoch, loop.iter, loop.max_iters
    hub = runner.message_hub
    return (hub.get_info('epoch'), hub.get_info('iter'),
            hub.get_info('max_iters'))


def built_train_loop(runner):
    """The runner's training loop if it is built, else None (reading
    ``runner.train_loop`` would build it, and its dataset, in a run that
    only evaluates)."""
    from mmengine.runner import BaseLoop
    loop = getattr(runner, '_train_loop', None)
    return loop if isinstance(loop, BaseLoop) else None

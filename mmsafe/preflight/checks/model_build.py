"""The model builds (on CPU, no weights, no forward pass) and its size.

Building catches constructor errors (a wrong argument, a missing key) that
would otherwise appear after the datasets are loaded; the parameter count
feeds the checkpoint disk estimate of the work dir check.
"""
from typing import Iterator

from ..context import PreflightContext
from ..report import CheckRow

NAME = 'model'


def check_model_build(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Build the model once and report its parameter count."""
    if ctx.cfg.get('model', None) is None:
        yield CheckRow('error', NAME, 'The config has no `model`.', 'model',
                       'Add a model dict (type=... and its arguments).')
        return
    if 'model' in ctx.state.get('registry_bad_sections', ()):
        yield CheckRow('info', NAME, 'Model not built: fix the registry '
                       'errors under `model` first.', 'model')
        return
    info = ctx.model_info()
    if info.model is None:
        yield CheckRow(
            'error', NAME, f'The model does not build: {info.error}', 'model',
            'Fix the argument named in the message; the traceback appears '
            'with `python -c "from mmengine import Config; from '
            'mmdet.registry import MODELS; import mmsafe; '
            'MODELS.build(Config.fromfile(CFG).model)"`.')
        return
    trainable = sum(p.numel() for p in info.model.parameters()
                    if p.requires_grad)
    yield CheckRow(
        'ok', NAME, f'{type(info.model).__name__} builds: '
        f'{info.num_params / 1e6:.2f} M parameters ({trainable / 1e6:.2f} M '
        f'trainable), {info.state_bytes / 2**20:.0f} MiB of weights.',
        'model.type')

"""The packages of the configured visualization backends import.

MMEngine imports a backend's package lazily, when the first scalar is
written: a missing ``tensorboard`` fails the run at its first logging
interval, after the datasets and the model are loaded.
"""
import importlib
from typing import Any, Dict, Iterator, List, Tuple

from ..context import PreflightContext, first_line
from ..report import CheckRow

NAME = 'visualizer'
# backend type -> (module to import, pip package)
REQUIRES: Dict[str, Tuple[str, str]] = {
    'TensorboardVisBackend': ('torch.utils.tensorboard', 'tensorboard'),
    'WandbVisBackend': ('wandb', 'wandb'),
    'MLflowVisBackend': ('mlflow', 'mlflow'),
    'ClearMLVisBackend': ('clearml', 'clearml'),
    'NeptuneVisBackend': ('neptune', 'neptune'),
    'DVCLiveVisBackend': ('dvclive', 'dvclive'),
    'AimVisBackend': ('aim', 'aim'),
}


def _backends(ctx: PreflightContext) -> List[Tuple[str, Any]]:
    found = []
    visualizer = ctx.cfg.get('visualizer', None)
    if isinstance(visualizer, dict):
        for i, b in enumerate(visualizer.get('vis_backends', None) or []):
            if isinstance(b, dict):
                found.append((f'visualizer.vis_backends[{i}]', b.get('type')))
    return found


def check_vis_backends(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Each configured vis backend's package imports."""
    backends = _backends(ctx)
    if not backends:
        yield CheckRow('info', NAME, 'No vis backends configured: scalars '
                       'go to the log only.', 'visualizer.vis_backends')
        return
    for where, type_name in backends:
        name = type_name if isinstance(type_name, str) else getattr(
            type_name, '__name__', str(type_name))
        module, package = REQUIRES.get(name.split('.')[-1], (None, None))
        if module is None:
            yield CheckRow('ok', NAME, f'{name} configured.', where)
            continue
        try:
            importlib.import_module(module)
        except Exception as err:
            yield CheckRow(
                'error', NAME, f'{name} is configured but `import {module}` '
                f'fails ({type(err).__name__}: {first_line(err, 200)}).',
                where, f'pip install {package} (tools/setup_env.sh installs '
                'it), or remove the backend from visualizer.vis_backends.')
            continue
        yield CheckRow('ok', NAME, f'{name}: {module} imports.', where)

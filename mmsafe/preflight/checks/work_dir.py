"""The work dir is writable and has room for the checkpoints of the run.

A checkpoint holds the weights, the optimizer state (momentum: one more copy
of the parameters; Adam: two) and a little metadata. ``CheckpointHook`` keeps
``max_keep_ckpts`` of them (all when -1) and writes the next one before
removing the oldest.
"""
import os.path as osp
import shutil
import tempfile
from typing import Iterator, Optional, Tuple

from ..context import PreflightContext
from ..report import CheckRow

NAME = 'work_dir'
# optimizer states per parameter (copies of the parameter tensor)
_OPTIM_STATES = {
    'SGD': 1, 'Adam': 2, 'AdamW': 2, 'Adamax': 2, 'NAdam': 2, 'RAdam': 2,
    'Adagrad': 1, 'RMSprop': 1, 'Adadelta': 2, 'Lion': 1, 'Rprop': 2
}
DEFAULT_KEEP = 3
LOG_ROOM = 100 * 2**20  # logs, TensorBoard events, event log


def _existing_ancestor(path: str) -> Tuple[str, str]:
    """The nearest existing ancestor of ``path``; (ancestor, first missing)."""
    path = osp.abspath(path)
    missing = ''
    while not osp.exists(path):
        missing = path
        parent = osp.dirname(path)
        if parent == path:
            break
        path = parent
    return path, missing


def _writable(path: str) -> Optional[str]:
    """Why ``path`` (an existing dir) is not writable, or None."""
    if not osp.isdir(path):
        return f'{path} is a file, not a folder'
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix='.mmsafe_preflight'):
            pass
    except OSError as err:
        return f'cannot create a file in {path}: {err.strerror or err}'
    return None


def _optim_states(ctx: PreflightContext) -> int:
    optimizer = (ctx.cfg.get('optim_wrapper', None) or {}).get(
        'optimizer', None) or {}
    name = str(optimizer.get('type', 'SGD')).split('.')[-1]
    states = _OPTIM_STATES.get(name, 2)
    if name == 'SGD' and not optimizer.get('momentum', 0):
        states = 0
    return states


def _kept(ctx: PreflightContext) -> Tuple[int, str]:
    """How many checkpoints exist at once, and why."""
    hook = (ctx.cfg.get('default_hooks', None) or {}).get('checkpoint', None)
    if not isinstance(hook, dict):
        return 0, 'no CheckpointHook'
    keep = hook.get('max_keep_ckpts', -1)
    extra = 1 if hook.get('save_best', None) else 0
    if isinstance(keep, int) and keep > 0:
        # the next one is written before the oldest is removed
        return keep + 1 + extra, f'max_keep_ckpts={keep}, +1 while saving'
    train_cfg = ctx.cfg.get('train_cfg', None) or {}
    interval = max(1, int(hook.get('interval', 1) or 1))
    by_epoch = hook.get('by_epoch', True)
    total = train_cfg.get('max_epochs' if by_epoch else 'max_iters', None)
    if isinstance(total, int) and total > 0:
        return total // interval + extra, (
            f'max_keep_ckpts=-1: all {total // interval} checkpoints kept')
    return DEFAULT_KEEP + extra, f'assumed {DEFAULT_KEEP}'


def check_work_dir(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Check the work dir is writable and has room for the checkpoints."""
    work_dir = ctx.cfg.get('work_dir', None)
    if not work_dir:
        yield CheckRow('error', NAME, 'No work_dir is set.', 'work_dir',
                       'Pass --work-dir DIR (tools/train.py sets '
                       './work_dirs/<config name> by default).')
        return
    if '://' in str(work_dir):
        yield CheckRow('info', NAME, f'{work_dir}: remote storage, not '
                       'checked.', 'work_dir')
        return
    base, missing = _existing_ancestor(work_dir)
    problem = _writable(base)
    if problem:
        yield CheckRow(
            'error', NAME, f'work_dir {work_dir!r} cannot be '
            f'{"created" if missing else "written"}: {problem}.', 'work_dir',
            'Choose a writable folder: --work-dir DIR.')
        return
    free = shutil.disk_usage(base).free
    info = ctx.model_info()
    if info.model is None:
        yield CheckRow('ok', NAME, f'{work_dir} is writable; '
                       f'{free / 2**30:.1f} GiB free (checkpoint size '
                       'unknown: the model did not build).', 'work_dir')
        return
    states = _optim_states(ctx)
    params = sum(p.numel() * p.element_size()
                 for p in info.model.parameters() if p.requires_grad)
    ckpt = info.state_bytes + states * params
    kept, why = _kept(ctx)
    need = ckpt * kept + LOG_ROOM
    detail = (f'{kept} checkpoints ({why}) x {ckpt / 2**20:.0f} MiB '
              f'(weights + {states} optimizer state(s)) + logs = '
              f'{need / 2**30:.2f} GiB; {free / 2**30:.1f} GiB free at '
              f'{base}')
    if free < need:
        yield CheckRow(
            'error', NAME, f'Not enough disk space: {detail}.',
            'default_hooks.checkpoint.max_keep_ckpts',
            'Free space, choose another --work-dir, or keep fewer '
            'checkpoints: default_hooks.checkpoint.max_keep_ckpts=2.')
    elif free < 2 * need:
        yield CheckRow('warn', NAME, f'Little disk space left: {detail}.',
                       'work_dir', 'Free space or keep fewer checkpoints.')
    else:
        yield CheckRow('ok', NAME, f'{work_dir} is writable; {detail}.',
                       'work_dir')

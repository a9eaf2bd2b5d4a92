"""``load_from`` / resume files exist and load safely; pretrained weights
(``init_cfg``, ``pretrained=``, URLs and model-zoo names) are available
offline (:mod:`.pretrained_weights`).

The file is loaded once here with mmsafe's loader (the one training uses,
memory-mapped): a file that is not a plain ``torch.save`` archive or holds
anything but plain data is an error row naming what it is. Its keys are
compared with the built model's, so a checkpoint of another model shows
before training rather than as a wall of "missing keys" warnings.
"""
import os.path as osp
from typing import Any, Iterator, List, Optional, Tuple

from ..context import PreflightContext, first_line
from ..report import CheckRow
from .pretrained_weights import (check_pretrained_weights, is_remote,
                                 remote_source_rows)

NAME = 'checkpoint'


def _safe_load(path: str, cfg) -> Tuple[Any, Optional[str], Optional[str]]:
    """Load with mmsafe's loader; (object, problem, fix of a refusal)."""
    from mmsafe.checkpoint import (CheckpointFormatError,
                                   UntrustedCheckpointError,
                                   load_checkpoint_file,
                                   trusted_checkpoint_globals)
    try:
        with trusted_checkpoint_globals(cfg=cfg):
            obj = load_checkpoint_file(path, map_location='cpu', mmap=True)
    except UntrustedCheckpointError as err:
        return None, _refusal(err), (
            'Only for a file you trust, and only when the message offers '
            "it: mmsafe_trusted_globals = ['<module.Name>'] in the config "
            '(weights_only stays on); otherwise re-save the checkpoint with '
            'plain data.')
    except CheckpointFormatError as err:
        return None, _refusal(err), (
            'Convert an old or TorchScript checkpoint once, outside '
            'training (docs/user_guides/training_safety.md#converting-an-'
            'old-checkpoint), or use another file.')
    except Exception as err:
        return None, f'{type(err).__name__}: {first_line(err)}', None
    return obj, None, None


def _refusal(err: Exception) -> str:
    """mmsafe's refusal, without its leading "[mmsafe] Refused to load
    checkpoint '...': " (the row names the file)."""
    text = str(err)
    marker = "': "
    if text.startswith('[mmsafe] Refused to load checkpoint') and \
            marker in text:
        text = text.split(marker, 1)[1]
    return f'{type(err).__name__}: {text}'


def _state_dict(obj: Any) -> Optional[dict]:
    if isinstance(obj, dict):
        inner = obj.get('state_dict', obj.get('model', obj))
        if isinstance(inner, dict):
            return inner
    return None


def _key_rows(state: dict, ctx: PreflightContext, where: str,
              strict_shapes: bool) -> List[CheckRow]:
    model = ctx.model_info().model
    if model is None or state is None:
        return []
    own = model.state_dict()
    keys = {k[7:] if k.startswith('module.') else k: v
            for k, v in state.items()}
    matched = [k for k in keys if k in own]
    if not matched:
        return [CheckRow(
            'error' if strict_shapes else 'warn', NAME,
            f'None of the checkpoint\'s {len(keys)} keys matches the model\'s '
            f'{len(own)} parameters and buffers (e.g. {next(iter(keys), "")!r}'
            f' vs {next(iter(own), "")!r}): it belongs to another model.',
            where, 'Point it at a checkpoint of this model (or convert the '
            'key names).')]
    shape = [k for k in matched if hasattr(keys[k], 'shape')
             and tuple(keys[k].shape) != tuple(own[k].shape)]
    missing = len(own) - len(matched)
    if shape:
        return [CheckRow(
            'error' if strict_shapes else 'warn', NAME,
            f'{len(shape)} tensors differ in shape from the model, e.g. '
            f'{shape[0]}: {tuple(keys[shape[0]].shape)} vs '
            f'{tuple(own[shape[0]].shape)}.', where,
            'Expected when fine-tuning with another class count (those '
            'layers start fresh); otherwise use a matching checkpoint.')]
    return [CheckRow('ok', NAME, f'{len(matched)} of {len(own)} model '
                     f'tensors found in the checkpoint ({missing} missing).',
                     where)]


def _check_file(path: str, where: str, ctx: PreflightContext,
                resume: bool) -> Iterator[CheckRow]:
    if is_remote(path):
        cached = _cached_remote(path)
        if cached is None:
            # not cached (or not resolvable): reachability and the fix
            yield from remote_source_rows(
                path, where, ctx.state.setdefault('weight_probes', {}))
            return
        path = cached
    elif '://' in path:
        yield CheckRow('info', NAME, f'{path}: remote storage, not checked.',
                       where)
        return
    if not osp.isfile(path):
        yield CheckRow('error', NAME, f'{path!r} does not exist '
                       f'(absolute: {osp.abspath(path)}).', where,
                       'Fix the path, or remove it to train from scratch.')
        return
    obj, problem, fix = _safe_load(path, ctx.cfg)
    if problem:
        fix = fix or ('The file is truncated or not a PyTorch checkpoint; '
                      'use another one (auto-resume picks the newest '
                      'loadable).')
        yield CheckRow('error', NAME, f'{path} does not load safely: '
                       f'{problem}', where, fix)
        return
    if resume and not (isinstance(obj, dict) and 'meta' in obj
                       and 'state_dict' in obj):
        yield CheckRow(
            'error', NAME, f'{path} has no training state (meta, '
            'state_dict, optimizer): it cannot be resumed from.', where,
            'Use it as load_from without resume (weights only).')
        return
    size = osp.getsize(path) / 2**20
    yield CheckRow('ok', NAME, f'{path} loads with weights_only=True '
                   f"(mmsafe's loader: plain data only; {size:.0f} MiB).",
                   where)
    yield from _key_rows(_state_dict(obj), ctx, where, strict_shapes=resume)


def _cached_remote(name: str) -> Optional[str]:
    """The torch hub cache file of a URL / zoo name, if it is there."""
    from mmsafe.checkpoint.remote_weights import cache_path, resolve_url
    try:
        cached = cache_path(resolve_url(name))
    except (ImportError, KeyError):
        return None
    return cached if osp.isfile(cached) else None


def check_checkpoints(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Check ``load_from``, the resume target and pretrained weights."""
    cfg = ctx.cfg
    load_from = cfg.get('load_from', None)
    resume = bool(cfg.get('resume', False))
    if resume and not load_from:
        work_dir = cfg.get('work_dir', None)
        target = None
        if work_dir and osp.isdir(work_dir):
            from mmsafe.checkpoint import find_latest_loadable_checkpoint
            try:
                target = find_latest_loadable_checkpoint(work_dir)
            except Exception as err:  # no checkpoint there loads
                yield CheckRow(
                    'error', NAME, f'Auto-resume: {first_line(err)}',
                    'resume', 'Remove the broken checkpoints or resume from '
                    'an explicit file (--resume PATH).')
                return
        if target is None:
            yield CheckRow('info', NAME, f'resume=True but {work_dir} has no '
                           'checkpoint yet: training starts from scratch.',
                           'resume')
        else:
            yield from _check_file(target, 'resume', ctx, resume=True)
    elif load_from:
        yield from _check_file(str(load_from), 'load_from', ctx, resume)
    else:
        yield CheckRow('ok', NAME, 'No load_from / resume: training starts '
                       'from the initial weights.', 'load_from')
    yield from check_pretrained_weights(ctx)

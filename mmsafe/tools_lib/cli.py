"""What mmsafe's command-line tools share: loading a config as
MMDetection's tools do (``mmsafe::`` names included), building the runner,
and a clean distributed end."""
import contextlib
import logging
import os.path as osp
from typing import Iterator, Optional

from mmsafe.errors import MMSafeFileNotFoundError

#: mmsafe's configs: the clone's ``configs/`` folder, copied into an
#: installed package (linked in an editable install)
CONFIG_DIR = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))),
                      '.mim', 'configs')


def scoped_config_path(config: str) -> str:
    """The file of a config named on a command line by package:
    ``mmsafe::llvip/demo_cpu.py`` is ``llvip/demo_cpu.py`` of
    :data:`CONFIG_DIR`, ``mmdet::...`` the same in the installed
    MMDetection's ``.mim/configs``; ``config`` itself when it names no
    package.

    Raises:
        FileNotFoundError: the package has no such config; the message
            says where it looked.
    """
    scope, sep, rel = config.partition('::')
    if not sep:
        return config
    if scope == 'mmsafe':
        root = CONFIG_DIR
    else:
        from mmengine.config.utils import MODULE2PACKAGE
        from mmengine.utils import get_installed_path
        root = osp.join(get_installed_path(MODULE2PACKAGE.get(scope, scope)),
                        '.mim', 'configs')
    path = osp.join(root, rel)
    if not osp.isfile(path):
        raise MMSafeFileNotFoundError(
            f'[mmsafe] {config!r}: no such config in {root}. A package '
            "ships its configs there (mmsafe's are those of a clone's "
            "configs/ folder, e.g. 'mmsafe::llvip/demo_cpu.py').")
    return path


def read_config(config: str):
    """``Config.fromfile(config)``, where ``mmsafe::`` paths (in ``_base_``
    or as ``config`` itself) resolve to the installed package's configs."""
    from mmengine.config import Config

    from mmsafe.compat.config_scope import register_config_scope
    register_config_scope()
    return Config.fromfile(scoped_config_path(config))


def load_config(config: str, launcher: str, cfg_options: Optional[dict],
                work_dir: Optional[str]):
    """Load ``config`` with ``--cfg-options``, ``--launcher`` and
    ``--work-dir`` applied; the work dir defaults to
    ``./work_dirs/<config name>``."""
    cfg = read_config(config)
    cfg.launcher = launcher
    if cfg_options is not None:
        cfg.merge_from_dict(cfg_options)
        warn_unreached_data_root(cfg, cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(config))[0])
    return cfg


def warn_unreached_data_root(cfg, cfg_options: dict) -> list:
    """Warn when ``--cfg-options data_root=X`` leaves the datasets on
    another root: MMEngine fills the file's top-level ``data_root`` into
    the datasets when it reads the file, so a later top-level value does
    not reach them. Returns the datasets' ``path.data_root=value`` that
    differ (nothing is changed)."""
    if 'data_root' not in cfg_options:
        return []
    from mmsafe.datasets.walk import config_leaves
    new = cfg_options['data_root']
    stale = []  # (key, the dataset's own root)
    for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg.get(name, None)
        dataset = loader.get('dataset', None) \
            if isinstance(loader, dict) else None
        if not isinstance(dataset, dict):
            continue
        for path, leaf in config_leaves(dataset, f'{name}.dataset'):
            root = leaf.get('data_root', None)
            if root is not None and root != new:
                stale.append((f'{path}.data_root', root))
    if stale:
        from mmsafe.events import log
        log(f'--cfg-options data_root={new!r} sets the top-level data_root '
            'only: MMEngine filled the config file\'s data_root into the '
            'datasets when it read the file, and they keep it: '
            + ', '.join(f'{key}={root!r}' for key, root in stale) +
            '. To move them: --cfg-options '
            + ' '.join(f'{key}={new}' for key, _ in stale), logging.WARNING)
    return [f'{key}={root!r}' for key, root in stale]


def build_runner(cfg):
    """The registered ``runner_type`` of the config; mmsafe's tools default
    to :class:`~mmsafe.engine.runner.SafeRunner` when the config names none
    (``--cfg-options runner_type=Runner`` picks MMEngine's plain Runner)."""
    from mmengine.registry import RUNNERS
    if 'runner_type' not in cfg:
        cfg.runner_type = 'SafeRunner'
        from mmsafe.events import log
        log("runner: SafeRunner (the default of mmsafe's tools when a config "
            'sets no runner_type)')
    return RUNNERS.build(cfg)


@contextlib.contextmanager
def explained_unknown_types() -> Iterator[None]:
    """Re-raise MMEngine's "X is not in the ... registry" KeyError with the
    closest mmsafe names (:func:`mmsafe.registry_help.explain_unknown_type`).
    """
    try:
        yield
    except KeyError as err:
        from mmsafe.registry_help import explain_unknown_type
        better = explain_unknown_type(err)
        if better is None:
            raise
        raise better from err


# The work of the final barrier of a distributed run, kept to the end of
# the process (see ``release_process_group``).
_FINAL_BARRIER = None


def release_process_group(runner=None) -> None:
    """End a distributed run that finished cleanly: close ``runner``'s rank
    channel (when it has one), barrier, then destroy the process group,
    keeping the barrier's work object until exit.

    Why the work is kept (torch 2.13, gloo): each ``pt_gloo_runloop`` worker
    thread drops its reference to a work once it has run it. When that is
    the last reference, the work (for a barrier, with the earlier works it
    waited for) is destroyed on that thread, and its captured
    ``at::ThreadLocalState`` releases a Python object, which takes the GIL.
    ``barrier()`` returns before that; if the interpreter is finalising by
    then, Python ends the thread with ``pthread_exit``, whose forced unwind
    through the noexcept destructor calls ``std::terminate``: "terminate
    called without an active exception" (SIGABRT) after a complete run.
    Holding the final barrier's work here makes the main thread drop the
    last reference, at interpreter exit, while Python is still whole. The
    barrier also makes every rank finish before any rank tears the group
    down (MMEngine leaves it alive).

    Call it only after a clean finish: a crash keeps the group for the
    exception handlers (the safety report needs the rank) and exits
    non-zero anyway.
    """
    global _FINAL_BARRIER
    import torch.distributed as torch_dist

    if runner is not None:
        from mmsafe.engine.run_context import run_context
        channel = run_context(runner).rank_channel
        if channel is not None:
            channel.close()
    if torch_dist.is_available() and torch_dist.is_initialized():
        _FINAL_BARRIER = torch_dist.barrier(async_op=True)
        _FINAL_BARRIER.wait()
        torch_dist.destroy_process_group()

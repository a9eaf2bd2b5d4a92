"""What ``tools/train.py`` and ``tools/test.py`` share: loading a config as
MMDetection's tools do, building the runner, and a clean distributed exit."""
import os.path as osp
from typing import Optional


def load_config(config: str, launcher: str, cfg_options: Optional[dict],
                work_dir: Optional[str]):
    """Load ``config`` with ``--cfg-options``, ``--launcher`` and
    ``--work-dir`` applied; the work dir defaults to
    ``./work_dirs/<config name>``."""
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    cfg.launcher = launcher
    if cfg_options is not None:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(config))[0])
    return cfg


def build_runner(cfg):
    """MMEngine's Runner, or the registered ``runner_type`` of the config."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' not in cfg:
        return Runner.from_cfg(cfg)
    return RUNNERS.build(cfg)


# Set when this process released a process group after a clean finish.
_RELEASED = False


def release_process_group() -> None:
    """Destroy the default process group before the interpreter exits.

    MMEngine leaves it alive; when Python then tears down a live gloo group,
    or one rank closes its connections while a peer still uses them, gloo's
    threads can abort the process ("terminate called without an active
    exception") after a run that finished cleanly. The barrier makes every
    rank finish before any rank tears the group down. Call it only after a
    clean finish: a crash keeps the group for the exception handlers (the
    safety report needs the rank) and exits non-zero anyway.
    """
    global _RELEASED
    import torch.distributed as torch_dist
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()
        _RELEASED = True


def exit_after_distributed_run() -> None:
    """End a distributed process that finished cleanly without interpreter
    teardown.

    Even after ``release_process_group`` a gloo rank sometimes aborts while
    Python tears down torch's native threads (seen in about one of 15
    two-process runs, always after the last hook had run). By then the run
    is complete: MMEngine's LoggerHook closed the visualizer in
    ``after_run``; logs and streams are flushed here, then the process exits
    0. Single-process runs return normally.
    """
    if not _RELEASED:
        return
    import logging
    import os
    import sys
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

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
    teardown, after flushing everything it wrote.

    Why (torch 2.13, gloo): ``destroy_process_group`` only unregisters the
    group; the DDP reducer still holds it, so its ``pt_gloo_runloop`` worker
    threads outlive ``main()``. Such a thread destroys each finished work
    object (the final barrier, the all-reduces it chains) on its own; the
    work's captured ``at::ThreadLocalState`` releases a Python object
    (``c10::SafePyObject``), which takes the GIL. When that happens while
    the interpreter is finalising, Python ends the thread with
    ``pthread_exit``, whose forced unwind through the noexcept destructor
    calls ``std::terminate`` ("terminate called without an active
    exception", SIGABRT) although the run is complete. The race is in torch,
    not in mmsafe, so the process skips interpreter teardown instead.

    Nothing is lost: the log file handlers are flushed and closed, every
    visualizer backend (TensorBoard event files included) is closed (a no-op
    when MMEngine's LoggerHook closed it in ``after_run``), mmsafe's event
    log is written line by line with the file closed after each event, and
    stdout/stderr are flushed. Single-process runs return normally.
    """
    if not _RELEASED:
        return
    import logging
    import os
    import sys

    from mmengine.visualization import Visualizer
    classes = [Visualizer]
    for cls in classes:  # each subclass keeps its own instances
        classes.extend(cls.__subclasses__())
        for visualizer in list(cls._instance_dict.values()):
            visualizer.close()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

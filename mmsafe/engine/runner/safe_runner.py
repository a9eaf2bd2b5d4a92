"""``SafeRunner``: MMEngine's Runner with mmsafe's run-level guarantees.

A config opts in with one line (``configs/_base_/safety_runtime.py`` sets
it)::

    runner_type = 'SafeRunner'

MMDetection's and mmsafe's ``tools/train.py`` build the runner from
``runner_type``. Every guarantee below is an override of a public Runner
method that calls MMEngine's own implementation; nothing of MMEngine is
modified.
"""
import contextlib
import logging
from typing import Dict, Iterator, Optional

import torch.nn as nn
from mmengine.device import get_device
from mmengine.dist import is_distributed
from mmengine.model import is_model_wrapper
from mmengine.registry import MODEL_WRAPPERS, RUNNERS
from mmengine.runner import Runner

from mmsafe.checkpoint import (ATOMIC_BACKEND_ARGS, explain_refusals,
                               find_latest_loadable_checkpoint, is_local_path,
                               record_resume,
                               register_local_weights_only_scheme,
                               register_remote_weight_schemes,
                               trusted_checkpoint_globals)
from mmsafe.engine.monitor_sync import MonitorSync
from mmsafe.engine.optimizers import NaNSkipOptimWrapper
from mmsafe.events import log
from .cpu_dist import cuda_usable, init_cpu_process_group, with_default_timeout
from .stop import StopTraining


@RUNNERS.register_module()
class SafeRunner(Runner):
    """MMEngine's Runner, plus:

    * **DDP on CPU**: with ``--launcher pytorch`` (or slurm) and no CUDA the
      process group uses gloo and the model is wrapped without
      ``device_ids``; a distributed config without
      ``env_cfg.dist_cfg.timeout`` gets a finite one (1800 s).
    * **checkpoints**: every load (``load_from``, ``resume``, pretrained
      ``init_cfg``) from a file or URL loads weights-only on every torch
      (MMEngine's CheckpointLoader schemes for local paths and URLs) and
      trusts what MMEngine/MMDetection checkpoints hold plus
      ``mmsafe_trusted_globals`` (:mod:`mmsafe.checkpoint.trust`); local
      checkpoints are written atomically
      (:class:`~mmsafe.checkpoint.AtomicLocalBackend`);
      ``resume=True`` resumes from the newest checkpoint that loads;
      pretrained weights by URL come from the torch hub cache or one clear
      error (:mod:`mmsafe.checkpoint.remote_weights`).
    * skip events of :class:`~mmsafe.engine.optimizers.NaNSkipOptimWrapper`
      go to ``{work_dir}/mmsafe_events.jsonl``;
    * ``monitor_sync``: the :class:`~mmsafe.engine.monitor_sync.MonitorSync`
      that every mmsafe hook of this run posts to, so that under DDP their
      monitoring values travel in one all-reduce per log interval.
    * a :class:`~mmsafe.engine.runner.StopTraining` raised by a hook ends
      training cleanly (``after_train`` and ``after_run`` hooks run, the
      model is returned);
    * any other exception of ``train``/``val``/``test`` is handed to
      :meth:`SafetyReportHook.report_crash` (when that hook is configured)
      and raised again, unchanged.

    Arguments are those of :class:`mmengine.runner.Runner`.
    """

    def __init__(self, *args, **kwargs) -> None:
        self.monitor_sync = MonitorSync()
        register_local_weights_only_scheme()
        register_remote_weight_schemes()
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------ distributed --
    def setup_env(self, env_cfg: Dict) -> None:
        if self.distributed and not is_distributed():
            env_cfg = dict(env_cfg)
            env_cfg['dist_cfg'] = with_default_timeout(
                env_cfg.get('dist_cfg'))
            if not cuda_usable():
                init_cpu_process_group(self.launcher, env_cfg['dist_cfg'])
        super().setup_env(env_cfg)

    def wrap_model(self, model_wrapper_cfg: Optional[Dict],
                   model: nn.Module) -> nn.Module:
        if (not self.distributed or is_model_wrapper(model)
                or get_device() != 'cpu' or self.cfg.get('sync_bn')):
            return super().wrap_model(model_wrapper_cfg, model)
        # DistributedDataParallel takes no device_ids for a CPU module.
        cfg = dict(model_wrapper_cfg or dict(
            broadcast_buffers=False,
            find_unused_parameters=self.cfg.get('find_unused_parameters',
                                                False)))
        cfg.setdefault('type', 'MMDistributedDataParallel')
        return MODEL_WRAPPERS.build(cfg, default_args=dict(module=model))

    # ------------------------------------------------------ checkpoints --
    @contextlib.contextmanager
    def _trusted_loading(self, what: str) -> Iterator[None]:
        with trusted_checkpoint_globals(cfg=self.cfg), explain_refusals(what):
            yield

    def _init_model_weights(self) -> None:
        with self._trusted_loading('pretrained weights (init_cfg)'):
            super()._init_model_weights()

    def load_or_resume(self) -> None:
        if self._has_loaded or not (self._resume and self._load_from is None):
            return super().load_or_resume()
        with self._trusted_loading(self.work_dir):
            resume_from = find_latest_loadable_checkpoint(self.work_dir)
        if resume_from is not None:
            self.logger.info(
                f'Auto resumed from the latest checkpoint {resume_from}.')
            self.resume(resume_from)
            self._has_loaded = True

    def resume(self, filename: str, *args, **kwargs) -> None:
        with self._trusted_loading(filename):
            super().resume(filename, *args, **kwargs)
        record_resume(self, filename)

    def load_checkpoint(self, filename: str, *args, **kwargs):
        with self._trusted_loading(filename):
            return super().load_checkpoint(filename, *args, **kwargs)

    def save_checkpoint(self, out_dir: str, filename: str,
                        file_client_args: Optional[dict] = None,
                        *args, backend_args: Optional[dict] = None,
                        **kwargs) -> None:
        if (backend_args is None and file_client_args is None
                and is_local_path(out_dir)):
            backend_args = ATOMIC_BACKEND_ARGS
        super().save_checkpoint(out_dir, filename, file_client_args, *args,
                                backend_args=backend_args, **kwargs)

    def register_default_hooks(self, hooks: Optional[Dict] = None) -> None:
        hooks = dict(hooks or {})
        ckpt = hooks.get('checkpoint', dict(type='CheckpointHook',
                                            interval=1))
        if (isinstance(ckpt, dict)
                and ckpt.get('type') in ('CheckpointHook', None)
                and ckpt.get('backend_args') is None
                and ckpt.get('file_client_args') is None
                and is_local_path(ckpt.get('out_dir') or self.work_dir)):
            # Written and rotated atomically (max_keep_ckpts never leaves
            # fewer complete checkpoints than it keeps).
            hooks['checkpoint'] = dict(ckpt, backend_args=ATOMIC_BACKEND_ARGS)
        super().register_default_hooks(hooks)

    def build_optim_wrapper(self, optim_wrapper):
        """MMEngine's build; mmsafe's NaN-skip wrappers also get the work
        dir for their skip events."""
        built = super().build_optim_wrapper(optim_wrapper)
        inner = getattr(built, 'optim_wrappers', None)
        for wrapper in (inner.values() if isinstance(inner, dict)
                        else [built]):
            if isinstance(wrapper, NaNSkipOptimWrapper):
                wrapper.bind_work_dir(self.work_dir)
        return built

    # ------------------------------------------------------ run control --
    def train(self) -> nn.Module:
        with self._crash_reported():
            try:
                return super().train()
            except StopTraining as stop:
                saved = (f' (saved {stop.checkpoint})'
                         if stop.checkpoint else '')
                log(f'training stopped by a hook: {stop.reason}{saved}; '
                    'ending the run (after_train and after_run hooks run).',
                    logging.WARNING)
                self.call_hook('after_train')
                self.call_hook('after_run')
                return self.model

    def val(self) -> dict:
        with self._crash_reported():
            return super().val()

    def test(self) -> dict:
        with self._crash_reported():
            return super().test()

    @contextlib.contextmanager
    def _crash_reported(self) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            self._report_crash(exc)
            raise

    def _report_crash(self, exc: BaseException) -> None:
        from mmsafe.engine.hooks.safety_report_hook import SafetyReportHook
        for hook in self.hooks:
            if isinstance(hook, SafetyReportHook):
                hook.report_crash(self, exc)

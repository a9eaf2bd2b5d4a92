"""``SafeRunner``: MMEngine's Runner with mmsafe's run-level guarantees.

A config opts in with one line (``configs/_base_/safety_runtime.py`` sets
it)::

    runner_type = 'SafeRunner'

MMDetection's and mmsafe's ``tools/train.py`` build the runner from
``runner_type``. Each override below is a Runner method for which MMEngine
has no other extension point; it calls MMEngine's own implementation and
hands its concern to the module that owns it. Nothing of MMEngine is
modified.
"""
import inspect
from typing import Dict, Optional

import torch.nn as nn
from mmengine.runner import Runner

from mmsafe.checkpoint import register_checkpoint_schemes
from mmsafe.engine.monitor_sync import MonitorSync
from mmsafe.engine.optimizers.nan_skip_optim_wrapper import (
    bind_work_dirs, use_run_spike_skip)
from mmsafe.engine.run_context import RunContext
from mmsafe.guard_outputs import Event, GuardOutputs, Section
from mmsafe.registry import RUNNERS
from mmsafe.registry_help import announce_scope
from .checkpoints import (RunCheckpoints, atomic_save_args,
                          with_atomic_checkpoint_hook)
from .config_text import formatted_once
from .cpu_dist import (dist_env_cfg, env_cfg_or_default, wrap_on_cpu,
                       wraps_on_cpu)
from .crash import CrashPath, add_rank_fault_hook
from .dataloader import guard_built_loader
from .run_loops import BuiltLoops, resumable_train_loop
from .stop import TrainingPreempted, train_until_stopped

#: The private parts of MMEngine's ``Runner`` that SafeRunner uses, each
#: with why no public attribute or extension point serves
#: (tests/test_private_access.py keeps this list true).
MMENGINE_PRIVATE = {
    '_init_model_weights':
        'overridden: the one call around the loads of pretrained init_cfg '
        'weights, to load them trusted (no hook or public method is there)',
    '_randomness_cfg':
        'the randomness settings that MMEngine\'s resume compares the '
        'checkpoint\'s seed with, updated in place as that resume does '
        '(Runner.seed is the seed drawn, not the one configured)',
}


@RUNNERS.register_module()
class SafeRunner(Runner):
    """MMEngine's Runner, plus (each in its own module):

    * **the config text formatted once**
      (:mod:`~mmsafe.engine.runner.config_text`): the log, the dumps and
      every checkpoint's meta read one yapf run per content;
    * **the run context** (:mod:`mmsafe.engine.run_context`): the
      :class:`~mmsafe.engine.monitor_sync.MonitorSync` that all of
      the run's mmsafe hooks post to (under DDP their values travel in one
      all-reduce per log interval), the rank channel, the resume plan;
    * **DDP on CPU** (:mod:`~mmsafe.engine.runner.cpu_dist`): gloo, no
      ``device_ids``, a finite default ``env_cfg.dist_cfg.timeout``;
    * **checkpoints** (:mod:`~mmsafe.engine.runner.checkpoints`): trusted
      loading, atomic local saves, ``resume=True`` from the newest
      checkpoint that loads, the resumed seed, the resume plan;
    * **loops** (:mod:`~mmsafe.engine.runner.run_loops`): mmsafe's train
      loops in place of MMEngine's (a resumed epoch continues exactly);
      their loader workers stopped when the run ends;
    * **loaders** (:mod:`~mmsafe.engine.runner.dataloader`): unpaired
      wrapper pipelines refused, workers that outlive stop signals;
    * skip events of the NaN-skip optim wrappers in the event log, and
      their spike skip as the config's ``mmsafe_spike_skip`` sets it;
    * **stops** (:mod:`~mmsafe.engine.runner.stop`): a hook's
      ``StopTraining`` ends training cleanly (``after_train``/``after_run``
      hooks run); after ``Preempted``, ``TrainingPreempted`` is raised;
    * **failures** (:mod:`~mmsafe.engine.runner.crash`): a default
      ``RankFaultHook``, the rank channel under DDP, an error of
      ``train``/``val``/``test`` explained by the hooks, told to the other
      ranks, reported and raised.

    Arguments are those of :class:`mmengine.runner.Runner`.
    """

    guard_outputs = GuardOutputs(
        Section.RANK_FAULTS,
        events=(Event.RANK_FAILED, ))

    def __init__(self, *args, **kwargs) -> None:
        given = inspect.signature(Runner.__init__).bind(self, *args, **kwargs)
        given.apply_defaults()
        self.mmsafe_context = RunContext(monitor_sync=MonitorSync())
        self._checkpoints = RunCheckpoints(self, given.arguments['load_from'],
                                           given.arguments['resume'])
        self._crash = CrashPath(self)
        self._loops = BuiltLoops()
        register_checkpoint_schemes()
        arguments = dict(given.arguments)
        del arguments['self']
        arguments['cfg'] = formatted_once(arguments['cfg'])
        arguments['env_cfg'] = env_cfg_or_default(arguments['env_cfg'])
        super().__init__(**arguments)
        announce_scope()  # names a project registered after mmsafe's import
        self._crash.open_rank_channel()

    def register_hooks(self, default_hooks=None, custom_hooks=None) -> None:
        super().register_hooks(default_hooks, custom_hooks)
        add_rank_fault_hook(self)

    def register_default_hooks(self, hooks: Optional[Dict] = None) -> None:
        super().register_default_hooks(
            with_atomic_checkpoint_hook(hooks, self.work_dir))

    def setup_env(self, env_cfg: Dict) -> None:
        super().setup_env(dist_env_cfg(env_cfg, self.distributed,
                                       self.launcher))

    def wrap_model(self, model_wrapper_cfg: Optional[Dict],
                   model: nn.Module) -> nn.Module:
        if not wraps_on_cpu(self, model):
            return super().wrap_model(model_wrapper_cfg, model)
        return wrap_on_cpu(model_wrapper_cfg, self.cfg, model)

    @staticmethod
    def build_dataloader(dataloader, seed=None, diff_rank_seed=False):
        return guard_built_loader(Runner.build_dataloader(
            dataloader, seed=seed, diff_rank_seed=diff_rank_seed))

    def build_train_loop(self, loop):
        if isinstance(loop, dict):
            self._checkpoints.adopt_resumed_seed(self._randomness_cfg)
            loop = resumable_train_loop(loop)
        return self._loops.built('train', super().build_train_loop(loop))

    def build_val_loop(self, loop):
        return self._loops.built('val', super().build_val_loop(loop))

    def build_test_loop(self, loop):
        return self._loops.built('test', super().build_test_loop(loop))

    def build_optim_wrapper(self, optim_wrapper):
        built = super().build_optim_wrapper(optim_wrapper)
        bind_work_dirs(built, self.work_dir)
        use_run_spike_skip(built, self.cfg.get('mmsafe_spike_skip'))
        return built

    # ------------------------------------------------------ checkpoints --
    def _init_model_weights(self) -> None:
        with self._checkpoints.trusted('pretrained weights (init_cfg)'):
            super()._init_model_weights()

    def load_or_resume(self) -> None:
        if not self._checkpoints.auto_resumes():
            return super().load_or_resume()
        self._checkpoints.resume_latest()

    def resume(self, filename: str, *args, **kwargs) -> None:
        self._checkpoints.before_resume()
        with self._checkpoints.trusted(filename):
            super().resume(filename, *args, **kwargs)
        self._checkpoints.after_resume(filename)

    def load_checkpoint(self, filename: str, *args, **kwargs):
        with self._checkpoints.trusted(filename):
            checkpoint = super().load_checkpoint(filename, *args, **kwargs)
        self._checkpoints.after_load(checkpoint)
        return checkpoint

    def save_checkpoint(self, out_dir: str, filename: str,
                        file_client_args: Optional[dict] = None,
                        *args, backend_args: Optional[dict] = None,
                        **kwargs) -> None:
        super().save_checkpoint(
            out_dir, filename, file_client_args, *args,
            backend_args=atomic_save_args(out_dir, backend_args,
                                          file_client_args), **kwargs)

    # ------------------------------------------------------ run control --
    def train(self) -> nn.Module:
        with self._crash.reported():
            model, preempted = train_until_stopped(
                self, super().train, self._loops.stop_workers)
        # Outside the crash report: a stop signal is not a failure.
        if preempted is not None:
            raise TrainingPreempted(preempted.exit_code, preempted.checkpoint)
        return model

    def val(self) -> dict:
        with self._crash.reported():
            return super().val()

    def test(self) -> dict:
        with self._crash.reported():
            return super().test()

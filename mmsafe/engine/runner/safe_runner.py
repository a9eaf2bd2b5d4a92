"""``SafeRunner``: MMEngine's Runner with mmsafe's run-level guarantees.

A config opts in with one line (``configs/_base_/safety_runtime.py`` sets
it)::

    runner_type = 'SafeRunner'

MMDetection's and mmsafe's ``tools/train.py`` build the runner from
``runner_type``. Every guarantee below is an override of a public Runner
method that calls MMEngine's own implementation; nothing of MMEngine is
modified.
"""
import atexit
import contextlib
import logging
from typing import Any, Dict, Iterator, Optional

import torch.nn as nn
from mmengine.device import get_device
from mmengine.dist import is_distributed
from mmengine.model import is_model_wrapper
from mmengine.registry import MODEL_WRAPPERS, RUNNERS
from mmengine.runner import (BaseLoop, EpochBasedTrainLoop, IterBasedTrainLoop,
                             Runner)

from mmdet.registry import HOOKS

from mmsafe.checkpoint import (ATOMIC_BACKEND_ARGS, checkpoint_meta,
                               explain_refusals,
                               find_latest_loadable_checkpoint, is_local_path,
                               record_resume, register_checkpoint_schemes,
                               trusted_checkpoint_globals)
from mmsafe.datasets.loader.processes import IgnoreStopSignals
from mmsafe.datasets.pipeline_check import assert_wrapper_pipelines_paired
from mmsafe.dist import get_rank, get_world_size
from mmsafe.engine.loops import (ResumableEpochBasedTrainLoop,
                                 ResumableIterBasedTrainLoop,
                                 stop_loop_workers)
from mmsafe.engine.monitor_sync import MonitorSync
from mmsafe.engine.optimizers import NaNSkipOptimWrapper
from mmsafe.engine.rank_channel import (DEFAULT_PEER_GRACE, RankChannel,
                                        failed_party, failure_place)
from mmsafe.engine.resume_state import plan_resume
from mmsafe.engine.utils import train_progress
from mmsafe.guard_outputs import Event, GuardOutputs, Section
from mmsafe.events import log, write_event
from .cpu_dist import cuda_usable, init_cpu_process_group, with_default_timeout
from .errors import PeerRankFailedError, is_communication_error
from .stop import Preempted, StopTraining, TrainingPreempted

#: Seconds a rank whose own error looks like a consequence of another
#: rank's failure (a closed connection, a timed-out collective) waits for
#: that rank's record, to name the cause instead of the symptom.
PEER_RECORD_WAIT = 3.0

_NOT_LOOKED_UP = object()


@RUNNERS.register_module()
class SafeRunner(Runner):
    """MMEngine's Runner, plus:

    * **DDP on CPU**: with ``--launcher pytorch`` (or slurm) and no CUDA the
      process group uses gloo and the model is wrapped without
      ``device_ids``; a distributed config without
      ``env_cfg.dist_cfg.timeout`` gets a finite one (1800 s).
    * **checkpoints**: every load (``load_from``, ``resume``, pretrained
      ``init_cfg``) of every MMEngine CheckpointLoader scheme goes through
      mmsafe's loader (:mod:`mmsafe.checkpoint.loader`: plain data only,
      the same on every torch) plus ``mmsafe_trusted_globals``
      (:mod:`mmsafe.checkpoint.trust`); local
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
    * a fault on one rank is named where the user looks: every run gets a
      :class:`~mmsafe.engine.hooks.RankFaultHook` (unless the config has
      one), which reports a loss term that a rank stops producing; under
      DDP a :class:`~mmsafe.engine.rank_channel.RankChannel` carries each
      rank's findings to rank 0's console and log at once, and a rank's
      exception to every rank;
    * any other exception of ``train``/``val``/``test``: DDP's
      unused-parameter error is replaced by a
      :class:`~mmsafe.engine.runner.errors.DDPParameterError` that explains
      it (rank, iteration, loss terms, modules, fix); an error that only
      follows from another rank's failure (a closed connection) by a
      :class:`~mmsafe.engine.runner.errors.PeerRankFailedError` naming that
      rank's error; any other error is raised unchanged. Each is told to
      the other ranks, handed to the hooks' crash reports and raised
      (PyTorch's error as the ``__cause__``). A rank still inside its run
      ``mmsafe_peer_grace`` seconds (config key, default 10) after another
      rank failed ends itself, instead of waiting out the distributed
      timeout.

    Hooks take part in a failure through two optional methods, which the
    runner looks up on every registered hook (no hook class is named
    here):

    * ``explain_failure(runner, exc) -> dict | None``: asked hook by hook
      until one explains ``exc`` (the others return None): ``error``, the
      exception to raise in its place (``exc`` becomes its
      ``__cause__``), plus the fields of the report's root cause
      (:class:`~mmsafe.engine.hooks.RankFaultHook` for DDP's parameter
      errors);
    * ``report_crash(runner, exc, root_cause=None)``: called on every hook
      that has it, once the error to raise is known
      (:class:`~mmsafe.engine.hooks.SafetyReportHook` writes its report).

    Arguments are those of :class:`mmengine.runner.Runner`.
    """

    guard_outputs = GuardOutputs(
        Section.RANK_FAULTS,
        events=(Event.RANK_FAILED, ))

    def __init__(self, *args, **kwargs) -> None:
        self.monitor_sync = MonitorSync()
        self.rank_channel: Optional[RankChannel] = None
        #: How a resumed run continues (set by :meth:`resume`, carried out
        #: by mmsafe's train loops).
        self.resume_plan = None
        self._loaded_meta: Optional[dict] = None
        self._resume_found: Any = _NOT_LOOKED_UP
        register_checkpoint_schemes()
        super().__init__(*args, **kwargs)
        self._open_rank_channel()

    def _open_rank_channel(self) -> None:
        if get_world_size() < 2:
            return
        grace = self.cfg.get('mmsafe_peer_grace', DEFAULT_PEER_GRACE)
        channel = RankChannel(get_rank(), get_world_size(),
                              grace=float(grace),
                              on_peer_failure=self._peer_failed,
                              before_exit=self._ending_for_peer)
        if channel.open():
            self.rank_channel = channel
            atexit.register(channel.close)

    def register_hooks(self, default_hooks=None, custom_hooks=None) -> None:
        super().register_hooks(default_hooks, custom_hooks)
        rank_fault_hook = HOOKS.get('RankFaultHook')
        if not any(isinstance(h, rank_fault_hook) for h in self.hooks):
            self.register_hook(rank_fault_hook())

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

    # ------------------------------------------------------------ data --
    @staticmethod
    def build_dataloader(dataloader, seed=None, diff_rank_seed=False):
        """MMEngine's build; then a dataset wrapper whose own pipeline
        would move or mix one modality of the pairs it wraps (a plain
        ``Mosaic``/``MixUp`` in ``MultiImageMixDataset``) is refused here,
        naming ``PairedGeometric``, instead of failing at the first
        sample."""
        loader = Runner.build_dataloader(dataloader, seed=seed,
                                         diff_rank_seed=diff_rank_seed)
        assert_wrapper_pipelines_paired(getattr(loader, 'dataset', None))
        if getattr(loader, 'num_workers', 0) > 0:
            # A cluster signals every process of a job, Ctrl+C the whole
            # console: the training process decides how the run stops.
            loader.worker_init_fn = IgnoreStopSignals(loader.worker_init_fn)
        return loader

    def build_train_loop(self, loop):
        """MMEngine's build, with mmsafe's loops in place of MMEngine's
        ``EpochBasedTrainLoop``/``IterBasedTrainLoop`` (same arguments;
        they also continue a resumed epoch exactly:
        :mod:`mmsafe.engine.loops`)."""
        if isinstance(loop, dict):
            self._adopt_resumed_seed()
            loop = dict(loop)
            kind = loop.get('type')
            if kind is None:
                by_epoch = loop.pop('by_epoch', None)
                kind = ('EpochBasedTrainLoop' if by_epoch
                        else 'IterBasedTrainLoop' if by_epoch is not None
                        else None)
            if kind in ('EpochBasedTrainLoop', EpochBasedTrainLoop):
                loop['type'] = ResumableEpochBasedTrainLoop
            elif kind in ('IterBasedTrainLoop', IterBasedTrainLoop):
                loop['type'] = ResumableIterBasedTrainLoop
        return super().build_train_loop(loop)

    def _adopt_resumed_seed(self) -> None:
        """A resuming run whose config sets no seed takes the checkpoint's
        seed before its train loader is built.

        MMEngine's resume adopts the checkpoint's seed too, but only after
        the train loop built its loader: the sampler's order and the loader
        workers' seeds would come from a new random seed, so the resumed
        run would not draw the samples of the run it continues.
        """
        if not self._resume or self._randomness_cfg.get('seed') is not None:
            return
        target = self._resume_target()
        if target is None or '://' in target:
            return
        with self._trusted_loading(target):
            seed = checkpoint_meta(target).get('seed')
        if seed is None:
            return
        self._randomness_cfg.update(seed=seed)
        self.set_randomness(**self._randomness_cfg)
        log(f'resuming from {target}: the run takes its seed {seed} (the '
            'config sets randomness.seed to none), before the train loader '
            'is built')

    def _resume_target(self) -> Optional[str]:
        """The checkpoint this run resumes from: ``load_from``, or the
        newest loadable one of the work dir (looked up once)."""
        if self._load_from is not None:
            return self._load_from
        if self._resume_found is _NOT_LOOKED_UP:
            with self._trusted_loading(self.work_dir):
                self._resume_found = find_latest_loadable_checkpoint(
                    self.work_dir)
        return self._resume_found

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
        resume_from = self._resume_target()
        if resume_from is not None:
            self.logger.info(
                f'Auto resumed from the latest checkpoint {resume_from}.')
            self.resume(resume_from)
            self._has_loaded = True

    def resume(self, filename: str, *args, **kwargs) -> None:
        self._loaded_meta = None
        with self._trusted_loading(filename):
            super().resume(filename, *args, **kwargs)
        record_resume(self, filename)
        self.resume_plan = plan_resume(self, dict(meta=self._loaded_meta),
                                       filename)
        self._loaded_meta = None

    def load_checkpoint(self, filename: str, *args, **kwargs):
        with self._trusted_loading(filename):
            checkpoint = super().load_checkpoint(filename, *args, **kwargs)
        if isinstance(checkpoint, dict):
            self._loaded_meta = checkpoint.get('meta')
        return checkpoint

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
                model = super().train()
            except StopTraining as stop:
                saved = (f' (saved {stop.checkpoint})'
                         if stop.checkpoint else '')
                log(f'training stopped by a hook: {stop.reason}{saved}; '
                    'ending the run (after_train and after_run hooks run).',
                    logging.WARNING)
                self.call_hook('after_train')
                self.call_hook('after_run')
                self._stop_loader_workers()
                if not isinstance(stop, Preempted):
                    return self.model
                preempted = stop
            else:
                self._stop_loader_workers()
                return model
        # Outside the crash report: a stop signal is not a failure.
        raise TrainingPreempted(preempted.exit_code, preempted.checkpoint)

    def _stop_loader_workers(self) -> None:
        """The run is over: stop the loader workers its loops keep (an
        iteration loop has the next round's started), instead of leaving
        them to the interpreter's exit, where multiprocessing terminates
        them and torch reports "DataLoader worker ... is killed by signal"
        after a run that ended well."""
        for loop in (self._train_loop, self._val_loop, self._test_loop):
            if not isinstance(loop, BaseLoop):
                continue
            alive = stop_loop_workers(loop)
            if alive:
                log(f'loader worker processes {alive} did not stop at the '
                    'end of the run', logging.WARNING)

    def val(self) -> dict:
        with self._crash_reported():
            return super().val()

    def test(self) -> dict:
        with self._crash_reported():
            return super().test()

    @contextlib.contextmanager
    def _crash_reported(self) -> Iterator[None]:
        channel = self.rank_channel
        if channel is not None:
            channel.active = True
        try:
            yield
        except BaseException as exc:
            if channel is not None:
                channel.active = False
            explained = self._on_crash(exc)
            if explained is not None:
                raise explained from exc
            raise
        finally:
            if channel is not None:
                channel.active = False

    def _on_crash(self, exc: BaseException) -> Optional[BaseException]:
        """Explain, tell the other ranks, report; return the error to
        raise instead of ``exc`` (None: ``exc`` itself)."""
        channel = self.rank_channel
        rank = get_rank()
        details = None
        for hook in self.hooks:
            explain = getattr(hook, 'explain_failure', None)
            if callable(explain):
                details = explain(self, exc)
                if details is not None:
                    break
        peer = None
        if details is None and channel is not None:
            peer = channel.wait_for_peer_failure(
                PEER_RECORD_WAIT if is_communication_error(exc) else 0.0)
        explained: Optional[BaseException] = None
        if details is not None:
            explained = details.pop('error')
            root = dict(details, type=type(explained).__name__,
                        message=str(explained))
        elif peer is not None and is_communication_error(exc):
            explained = PeerRankFailedError(peer, rank, exc)
            root = peer
        else:
            _, done, _ = train_progress(self)
            root = dict(rank=rank, type=type(exc).__name__,
                        message=str(exc),
                        iter=None if done is None else done + 1)
            if peer is not None:
                root = dict(root, after_peer=peer)
        final = explained or exc
        if root is not peer:
            write_event(self.work_dir, Event.RANK_FAILED, **{
                k: v for k, v in root.items()
                if k not in ('message', 'cause', 'type', 'rank')},
                cause=root.get('cause', root.get('type')),
                error=f'{type(final).__name__}: {str(final)[:2000]}')
            if channel is not None:
                channel.publish_failure(root)
        self._report_crash(final, root)
        return explained

    def _peer_failed(self, record: dict) -> None:
        """Another rank failed (called in the channel's listener thread):
        rank 0 says so in its log and writes the report at once, since a
        launcher may end this process any moment."""
        if get_rank() != 0:
            return
        log(f'{failed_party(record)} failed{failure_place(record)}: '
            f'{record.get("type")}: '
            f'{record.get("message")}', logging.ERROR)
        channel = self.rank_channel
        if channel is not None and channel.active:
            # Still inside the run: the report now, since a launcher may end
            # this process any moment (a crash of this rank's own writes
            # its report itself).
            self._report_crash(PeerRankFailedError(record, 0), record)

    def _ending_for_peer(self, record: dict) -> None:
        """This rank ends itself because another rank failed: its
        report first."""
        self._report_crash(PeerRankFailedError(record, get_rank()), record)

    def _report_crash(self, exc: BaseException,
                      root_cause: Optional[dict] = None) -> None:
        for hook in self.hooks:
            report_crash = getattr(hook, 'report_crash', None)
            if callable(report_crash):
                report_crash(self, exc, root_cause=root_cause)

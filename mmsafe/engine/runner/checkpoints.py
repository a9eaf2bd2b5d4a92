"""How :class:`~mmsafe.engine.runner.SafeRunner` loads, resumes and saves
checkpoints.

* **trusted loading**: every load (``load_from``, ``resume``, pretrained
  ``init_cfg``) of every MMEngine CheckpointLoader scheme goes through
  mmsafe's loader (:mod:`mmsafe.checkpoint.loader`: plain data only, the
  same on every torch) plus the config's ``mmsafe_trusted_globals``
  (:mod:`mmsafe.checkpoint.trust`); a refusal names what was being loaded;
* **atomic saves**: checkpoints to a local folder (the runner's own and
  the default ``CheckpointHook``'s, rotation included) are written through
  :class:`~mmsafe.checkpoint.AtomicLocalBackend`, so ``max_keep_ckpts``
  never leaves fewer complete checkpoints than it keeps;
* **resume target**: ``resume=True`` without ``load_from`` resumes from the
  newest checkpoint of the work dir that loads (looked up once), and a
  resuming run whose config sets no seed takes that checkpoint's seed
  before its train loader is built;
* **resume plan**: after a resume, the
  :class:`~mmsafe.engine.resume_state.ResumePlan` goes to the run context
  (:func:`~mmsafe.engine.run_context.run_context`), where mmsafe's train
  loops find it.
"""
import contextlib
from typing import Any, Dict, Iterator, Optional

from mmsafe.checkpoint import (ATOMIC_BACKEND_ARGS, checkpoint_meta,
                               explain_refusals,
                               find_latest_loadable_checkpoint, is_local_path,
                               record_resume, trusted_checkpoint_globals)
from mmsafe.engine.resume_state import plan_resume
from mmsafe.engine.run_context import run_context
from mmsafe.events import log

_NOT_LOOKED_UP = object()


def atomic_save_args(out_dir: str, backend_args: Optional[dict],
                     file_client_args: Optional[dict]) -> Optional[dict]:
    """The ``backend_args`` of a ``save_checkpoint`` to ``out_dir``: the
    atomic local backend for a local folder when the caller chose no
    backend, else ``backend_args`` as given."""
    if (backend_args is None and file_client_args is None
            and is_local_path(out_dir)):
        return ATOMIC_BACKEND_ARGS
    return backend_args


def with_atomic_checkpoint_hook(hooks: Optional[Dict],
                                work_dir: str) -> Dict:
    """``default_hooks`` whose MMEngine ``CheckpointHook`` writes and
    rotates atomically when it saves to a local folder with no backend of
    its own (other hooks, and a ``CheckpointHook`` with a backend, as
    given)."""
    hooks = dict(hooks or {})
    ckpt = hooks.get('checkpoint', dict(type='CheckpointHook', interval=1))
    if (isinstance(ckpt, dict)
            and ckpt.get('type') in ('CheckpointHook', None)
            and ckpt.get('backend_args') is None
            and ckpt.get('file_client_args') is None
            and is_local_path(ckpt.get('out_dir') or work_dir)):
        hooks['checkpoint'] = dict(ckpt, backend_args=ATOMIC_BACKEND_ARGS)
    return hooks


class RunCheckpoints:
    """The checkpoints one SafeRunner loads and resumes from.

    Args:
        runner: the runner (its ``cfg``, ``work_dir``, ``set_randomness``).
        load_from (str, optional): the runner's ``load_from`` argument.
        resume (bool): the runner's ``resume`` argument.
    """

    def __init__(self, runner, load_from: Optional[str],
                 resume: bool) -> None:
        self.runner = runner
        self.load_from = load_from
        self.resumes = bool(resume)
        #: Whether a checkpoint was loaded or resumed from (by
        #: ``load_checkpoint``/``resume``, which every load goes through).
        self.loaded = False
        self._found: Any = _NOT_LOOKED_UP
        self._meta: Optional[dict] = None

    @contextlib.contextmanager
    def trusted(self, what: str) -> Iterator[None]:
        """Loads inside: mmsafe's loader with the config's trusted
        globals; a refusal names ``what``."""
        with trusted_checkpoint_globals(cfg=self.runner.cfg), \
                explain_refusals(what):
            yield

    def auto_resumes(self) -> bool:
        """Whether the run resumes from the newest loadable checkpoint of
        its work dir (``resume=True``, no ``load_from``, nothing loaded
        yet)."""
        return self.resumes and self.load_from is None and not self.loaded

    def target(self) -> Optional[str]:
        """The checkpoint this run resumes from: ``load_from``, or the
        newest loadable one of the work dir (looked up once)."""
        if self.load_from is not None:
            return self.load_from
        if self._found is _NOT_LOOKED_UP:
            work_dir = self.runner.work_dir
            with self.trusted(work_dir):
                self._found = find_latest_loadable_checkpoint(work_dir)
        return self._found

    def resume_latest(self) -> None:
        """Resume from :meth:`target`, when there is one (the run
        :meth:`auto_resumes`)."""
        resume_from = self.target()
        if resume_from is not None:
            self.runner.logger.info(
                f'Auto resumed from the latest checkpoint {resume_from}.')
            self.runner.resume(resume_from)

    def adopt_resumed_seed(self, randomness_cfg: Dict) -> None:
        """A resuming run whose config sets no seed takes the checkpoint's
        seed before its train loader is built.

        MMEngine's resume adopts the checkpoint's seed too, but only after
        the train loop built its loader: the sampler's order and the loader
        workers' seeds would come from a new random seed, so the resumed
        run would not draw the samples of the run it continues.

        Args:
            randomness_cfg (dict): the runner's randomness settings, the
                dict MMEngine's resume compares the checkpoint's seed with
                (updated in place, as that resume does).
        """
        if not self.resumes or randomness_cfg.get('seed') is not None:
            return
        target = self.target()
        if target is None or '://' in target:
            return
        with self.trusted(target):
            seed = checkpoint_meta(target).get('seed')
        if seed is None:
            return
        randomness_cfg.update(seed=seed)
        self.runner.set_randomness(**randomness_cfg)
        log(f'resuming from {target}: the run takes its seed {seed} (the '
            'config sets randomness.seed to none), before the train loader '
            'is built')

    def before_resume(self) -> None:
        """A resume starts: forget the meta of earlier loads."""
        self._meta = None

    def after_load(self, checkpoint: Any) -> None:
        """``load_checkpoint`` returned ``checkpoint``."""
        self.loaded = True
        if isinstance(checkpoint, dict):
            self._meta = checkpoint.get('meta')

    def after_resume(self, filename: str) -> None:
        """``resume`` from ``filename`` succeeded: count it and plan how
        the run continues."""
        runner = self.runner
        record_resume(runner, filename)
        run_context(runner).resume_plan = plan_resume(
            runner, dict(meta=self._meta), filename)
        self._meta = None

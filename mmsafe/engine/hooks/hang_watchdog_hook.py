"""Turn a frozen run into stack traces that say where each rank is stuck."""
from typing import Optional

from mmengine.hooks import Hook

from mmsafe.registry import HOOKS
from mmsafe.dist import get_rank, get_world_size
from mmsafe.engine.utils import unwrap_model
from mmsafe.engine.hang_watchdog import (ABORT_EXIT_CODE, HangReporter,
                                         Heartbeat, WatchdogThread)
from mmsafe.engine.hang_watchdog import heartbeat as ph
from mmsafe.engine.hang_watchdog.marks import PhaseMarks
from mmsafe.errors import MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section


@HOOKS.register_module()
class HangWatchdogHook(Hook):
    """Write the stacks of a rank that stops making progress.

    Every rank keeps a heartbeat with its phase. The phase is marked from
    this hook's methods and from PyTorch's extension points, registered in
    ``before_run`` and removed in ``after_run``:

    * forward pre/post hooks on the data preprocessor and the (unwrapped)
      model: ``data preprocessing``, ``forward``, then ``backward`` (with
      DDP ``backward (DDP gradient all-reduce: a collective)``), marked by
      the first forward of each iteration;
    * step pre/post hooks on the optimizer(s) of the optim wrapper:
      ``optimizer step``, then ``hooks (after_train_iter)``;
    * this hook's methods (it runs last in every event): ``data`` after an
      iteration (loading the next batch and the other hooks'
      ``before_train_iter``), ``validation (...)``/``test (...)``,
      ``saving a checkpoint``, ``epoch end``, ``setup``.

    A step that the optim wrapper skips marks no ``optimizer step``; its
    phase stays ``backward`` until the iteration ends.

    A watchdog thread checks the heartbeat; when no progress was made for
    ``timeout`` seconds (``first_iter_timeout`` until the first iteration of
    an epoch ends, ``val_timeout`` during validation and test) it writes the
    stacks of all threads to ``{work_dir}/hang_rank{R}.txt`` and to the log,
    naming the rank, iteration, phase and, when the main thread is inside a
    ``torch.distributed`` collective, that collective. A rank that waits in
    a collective is usually the victim: look for the rank whose report shows
    another phase. When progress resumes, that is logged too.

    With ``abort_timeout`` the process exits with code ``abort_exit_code``
    when ``abort_timeout`` more seconds pass without progress, so that
    ``torchrun --max-restarts`` or a scheduler can restart the job (resume
    with ``--resume``).

    If the main thread holds Python's global lock in native code, the
    watchdog thread cannot run; as a backstop, ``faulthandler`` then dumps
    the stacks to stderr.

    Args:
        timeout (float): seconds without progress before a report.
            Defaults to 300.
        first_iter_timeout (float): the same for the first iteration of
            each epoch (worker start-up, checkpoint loading, compilation).
            Defaults to 900.
        val_timeout (float): the same during validation and test
            (evaluation can take long). Defaults to 900.
        abort_timeout (float, optional): seconds after a report before the
            process exits. Defaults to None (never abort).
        abort_exit_code (int): exit code of an abort. Defaults to 75.
        poll_interval (float, optional): how often the watchdog looks;
            defaults to a tenth of the shortest deadline, at most 5 s.
        native_backstop (bool): arm ``faulthandler`` as described above.
            Defaults to True.
    """

    guard_outputs = GuardOutputs(
        Section.WATCHDOG_EVENTS,
        events=(Event.HANG, Event.HANG_ABORT),
        counters=(CounterKey.HANG_WATCHDOG, ))

    priority = 'LOWEST'  # runs last: its marks name what comes next

    def __init__(self,
                 timeout: float = 300.,
                 first_iter_timeout: float = 900.,
                 val_timeout: float = 900.,
                 abort_timeout: Optional[float] = None,
                 abort_exit_code: int = ABORT_EXIT_CODE,
                 poll_interval: Optional[float] = None,
                 native_backstop: bool = True) -> None:
        for name, value in (('timeout', timeout),
                            ('first_iter_timeout', first_iter_timeout),
                            ('val_timeout', val_timeout)):
            if value <= 0:
                raise MMSafeValueError(f'HangWatchdogHook: {name} must be > 0')
        self.timeout = float(timeout)
        self.first_iter_timeout = float(first_iter_timeout)
        self.val_timeout = float(val_timeout)
        self.abort_timeout = abort_timeout
        self.abort_exit_code = abort_exit_code
        shortest = min(self.timeout, self.first_iter_timeout,
                       self.val_timeout)
        self.poll_interval = poll_interval or min(5., max(.2, shortest / 10))
        self.native_backstop = native_backstop
        self._hb = Heartbeat()
        self._thread: Optional[WatchdogThread] = None
        self._reporter: Optional[HangReporter] = None
        self._marks = PhaseMarks(self._hb)
        self._training = False

    # ------------------------------------------------------- the marks --
    def _mark(self, phase: Optional[str] = None) -> None:
        self._hb.beat(phase)

    def _eval_phase(self, what: str) -> str:
        return self._marks.phase(what)

    def _allowance(self, phase: str, first: bool) -> float:
        if phase.startswith(ph.EVAL_STAGES):
            return self.val_timeout
        return self.first_iter_timeout if first else self.timeout

    # ------------------------------------------------------ run events --
    def before_run(self, runner) -> None:
        world_size = get_world_size()
        model = unwrap_model(runner.model)
        # runner.optim_wrapper is built before before_run by Runner.train.
        self._marks.attach(model, runner.optim_wrapper,
                           ddp=world_size > 1 and model is not runner.model)
        reporter = HangReporter(runner, get_rank(), world_size)
        self._reporter = reporter
        self._mark(ph.SETUP)
        self._thread = WatchdogThread(
            self._hb, self._allowance,
            on_stall=lambda phase, idle, allowance: reporter.report(
                phase, idle, allowance, self._hb.batch_idx),
            on_abort=lambda phase, idle: reporter.abort(
                phase, idle, self._hb.batch_idx, self.abort_exit_code),
            on_resume=reporter.resumed,
            poll_interval=self.poll_interval,
            abort_after=self.abort_timeout,
            native_backstop=self.native_backstop)
        self._thread.start()

    def after_run(self, runner) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        self._marks.detach()

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self._mark(ph.CHECKPOINT)

    # ------------------------------------------------------- training --
    def before_train(self, runner) -> None:
        self._training = True
        self._marks.stage = 'train'
        self._hb.first = True
        self._mark(ph.DATA)

    def after_train(self, runner) -> None:
        self._training = False
        self._mark()

    # -------------------------------------------------- evaluation --
    def _begin_eval(self, stage: str) -> None:
        self._marks.stage = stage
        self._mark(self._eval_phase('data'))

    def _end_eval(self) -> None:
        if self._training:
            self._marks.stage = 'train'
            self._mark(ph.DATA)
        else:
            self._mark(self._eval_phase('end'))

    def before_val(self, runner) -> None:
        self._begin_eval('validation')

    def after_val(self, runner) -> None:
        self._end_eval()

    def before_test(self, runner) -> None:
        self._begin_eval('test')

    def after_test(self, runner) -> None:
        self._end_eval()

    # ------------------------------- epochs and iterations, every mode --
    # MMEngine's Hook sends before/after_{train,val,test}_{epoch,iter}
    # here with ``mode``; validation and test are marked alike, with the
    # stage that before_val/before_test set.
    def _before_epoch(self, runner, mode: str = 'train') -> None:
        if mode == 'train':
            self._hb.first = True
            self._mark(ph.DATA)
        else:
            self._mark(self._eval_phase('data'))

    def _after_epoch(self, runner, mode: str = 'train') -> None:
        self._mark(ph.EPOCH_END if mode == 'train' else
                   self._eval_phase('end'))

    def _before_iter(self, runner, batch_idx: int, data_batch=None,
                     mode: str = 'train') -> None:
        self._hb.batch_idx = batch_idx
        self._marks.new_iteration()
        self._mark(ph.PREPROCESS if mode == 'train' else
                   self._eval_phase('data preprocessing'))

    def _after_iter(self, runner, batch_idx: int, data_batch=None,
                    outputs=None, mode: str = 'train') -> None:
        if mode == 'train':
            self._hb.first = False
            self._mark(ph.DATA)
        else:
            self._mark(self._eval_phase('data / evaluation'))

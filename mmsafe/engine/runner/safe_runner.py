"""``SafeRunner``: MMEngine's Runner with mmsafe's run-level guarantees.

A config opts in with one line (``configs/_base_/safety_runtime.py`` sets
it)::

    runner_type = 'SafeRunner'

MMDetection's and mmsafe's ``tools/train.py`` build the runner from
``runner_type``. Everything else is MMEngine's Runner unchanged.
"""
import logging

import torch.nn as nn
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from mmsafe.engine.monitor_sync import MonitorSync
from mmsafe.events import log
from .stop import StopTraining


@RUNNERS.register_module()
class SafeRunner(Runner):
    """MMEngine's Runner, plus:

    * ``monitor_sync``: the :class:`~mmsafe.engine.monitor_sync.MonitorSync`
      that every mmsafe hook of this run posts to, so that under DDP their
      monitoring values travel in one all-reduce per log interval;
    * a :class:`~mmsafe.engine.runner.StopTraining` raised by a hook ends
      training cleanly (``after_train`` and ``after_run`` hooks run, the
      model is returned);
    * any other exception of ``train``/``val``/``test`` is written to the
      crash report of :class:`~mmsafe.engine.hooks.SafetyReportHook` (when
      configured) and raised again, unchanged.

    Arguments are those of :class:`mmengine.runner.Runner`.
    """

    def __init__(self, *args, **kwargs) -> None:
        self.monitor_sync = MonitorSync()
        super().__init__(*args, **kwargs)

    def train(self) -> nn.Module:
        try:
            return super().train()
        except StopTraining as stop:
            log(f'{stop} at iteration {self.iter}; ending the run.',
                logging.WARNING)
            self.call_hook('after_train')
            self.call_hook('after_run')
            return self.model
        except BaseException as exc:
            self._report_crash(exc)
            raise

    def val(self) -> dict:
        try:
            return super().val()
        except BaseException as exc:
            self._report_crash(exc)
            raise

    def test(self) -> dict:
        try:
            return super().test()
        except BaseException as exc:
            self._report_crash(exc)
            raise

    def _report_crash(self, exc: BaseException) -> None:
        from mmsafe.engine.hooks.safety_report_hook import SafetyReportHook
        for hook in self.hooks:
            if isinstance(hook, SafetyReportHook):
                hook.report_crash(self, exc)

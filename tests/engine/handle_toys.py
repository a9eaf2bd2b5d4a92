"""A census of what a run's components register on the model, the
optimizer and the process (imported by the training subprocess through
``custom_imports``): :class:`HandleCensusHook` writes
``{work_dir}/handle_census.json`` with the counts before the run, after the
first training iteration and after the run (with
:class:`HandleCensusStartHook`)."""
import json
import os.path as osp
import signal
import threading

from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmsafe.guard_outputs import GuardOutputs

SIGNALS = [name for name in ('SIGTERM', 'SIGINT', 'SIGUSR1')
           if hasattr(signal, name)]


def census(runner) -> dict:
    model = runner.model
    modules = list(model.modules())
    if is_model_wrapper(model):
        modules += list(model.module.modules())
    hooks = sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) +
        len(m._backward_hooks) + len(getattr(m, '_backward_pre_hooks', {}))
        for m in modules)
    optimizer = runner.optim_wrapper.optimizer
    step_hooks = len(getattr(optimizer, '_optimizer_step_pre_hooks', {})) + \
        len(getattr(optimizer, '_optimizer_step_post_hooks', {}))
    return dict(
        module_hooks=hooks, optimizer_hooks=step_hooks,
        signals={name: repr(signal.getsignal(getattr(signal, name)))
                 for name in SIGNALS},
        threads=sorted(t.name for t in threading.enumerate()
                       if t.is_alive() and 'mmsafe' in t.name.lower()))


@HOOKS.register_module()
class HandleCensusHook(Hook):
    """Counts hooks, signal handlers and mmsafe threads: before the run
    (first of all hooks, with :class:`HandleCensusStartHook`), after the
    first training iteration and after the run (last of all hooks)."""
    priority = 'LOWEST'
    counts: dict = {}

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        if 'during' not in self.counts:
            self.counts['during'] = census(runner)

    def after_run(self, runner) -> None:
        self.counts['after'] = census(runner)
        with open(osp.join(runner.work_dir, 'handle_census.json'), 'w') as f:
            json.dump(self.counts, f, indent=1)


@HOOKS.register_module()
class HandleCensusStartHook(Hook):
    """The census before any other hook's ``before_run``."""
    priority = 'HIGHEST'

    def before_run(self, runner) -> None:
        HandleCensusHook.counts['before'] = census(runner)


@HOOKS.register_module()
class PluginReportHook(Hook):
    """A plugin's hook that declares its own outputs on its class (and does
    nothing else to declare them), emits them every iteration and takes
    part in a failure through SafeRunner's optional hook methods
    (``explain_failure``, ``report_crash``), writing what it was handed to
    ``{work_dir}/plugin_crash.json``."""

    guard_outputs = GuardOutputs('plugin', events=('plugin_seen', ),
                                 counters=('plugin', ))

    def __init__(self):
        self.seen = 0

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        from mmsafe.events import update_counters, write_event
        self.seen += 1
        write_event(runner.work_dir, 'plugin_seen', iter=runner.iter + 1)
        update_counters('plugin', seen=self.seen)

    def explain_failure(self, runner, exc):
        if 'toy crash' not in str(exc):
            return None
        return dict(error=RuntimeError(f'explained by the plugin: {exc}'),
                    cause='plugin_explained', iter=runner.iter + 1)

    def report_crash(self, runner, exc, root_cause=None):
        with open(osp.join(runner.work_dir, 'plugin_crash.json'), 'w') as f:
            json.dump(dict(type=type(exc).__name__, message=str(exc),
                           root_cause=root_cause), f)

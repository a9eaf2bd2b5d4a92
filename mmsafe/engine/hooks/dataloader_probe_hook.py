"""Probe each DataLoader before its first batch; fall back to the main
process when its workers cannot deliver.

The checks themselves live in :mod:`mmsafe.datasets.loader`; this hook runs
them at the right moment and reports: log lines, ``dataloader_*`` events in
``mmsafe_events.jsonl`` and the ``mmsafe/dataloader_probe`` counters.
"""
import logging
from typing import Any, Dict, List, Optional, Sequence

from mmengine.hooks import Hook
from torch.utils.data import DataLoader

from mmsafe.registry import HOOKS
from mmsafe.datasets.loader import (DEFAULT_PREFETCH, PICKLING_START_METHODS,
                                    budget_bytes, diagnose_loader,
                                    inflight_bytes, local_processes,
                                    rebuild_loader, start_method,
                                    workers_that_fit)
from mmsafe.datasets.walk import is_paired_dataset
from mmsafe.dist import get_rank
from mmsafe.engine.guard_status import ACTIVE, INACTIVE
from mmsafe.engine.loops import replace_loop_loader
from mmsafe.errors import MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import log, update_counters, write_event
from mmsafe.rng import preserved_rng_state

PROBE_MODES = ('auto', 'always', 'off')


@HOOKS.register_module()
class DataLoaderProbeHook(Hook):
    """Check every DataLoader with workers before its first batch.

    Before the first training iteration (and before the first validation
    and test), for each loader with ``num_workers > 0``:

    1. it pickles the dataset, collate_fn and worker_init_fn the way a
       spawn-started worker receives them, and names the object that cannot
       be pickled (e.g. ``dataset.pipeline.transforms[3].fn: <lambda>``);
    2. it fetches the first batch from each worker through real worker
       processes with the loader's own settings (start method, prefetch
       factor, persistent workers, and a restart as the second epoch does
       for persistent workers), under a deadline; workers that do not
       answer are killed, and no worker process outlives the probe.

    A loop that starts its loader's workers when it is built
    (``IterBasedTrainLoop``) gets its loader probed before that, when
    :class:`~mmsafe.engine.runner.SafeRunner` builds it
    (:meth:`prepare_loader`); under another runner the probe runs at
    ``before_train``, after those workers started, and says so.

    When the workers cannot deliver, the loop's loader is rebuilt with the
    same dataset, sampler, batch sampler and collate_fn, with
    ``num_workers=0, persistent_workers=False`` and no prefetch factor,
    and one loud warning names the cause and the config line to change.
    An error that the dataset raises without workers as well is a bug in
    the data, not in the workers: it is raised, never hidden by a
    fallback. When the probe passes, the original loader is kept untouched.

    From the probed batch it also estimates the memory of the batches in
    flight, ``local ranks x num_workers x prefetch_factor x batch bytes``,
    warns when that exceeds the budget, and can cap the workers to fit.

    Args:
        probe (str): when the probe runs and what makes it fall back.
            ``'auto'`` probes and falls back on a definite
            failure (unpicklable under spawn/forkserver, worker crash,
            deadline); a loader it cannot probe is kept with a warning,
            except for spawn/forkserver workers on paired (visible +
            infrared) data, which fall back unless the probe passes.
            ``'always'``: every outcome but a pass falls back. ``'off'``:
            do nothing. Defaults to ``'auto'``.
        timeout (float): seconds the workers get to deliver their first
            batches, worker start-up included. Defaults to 60.
        loaders (Sequence[str]): which loops' loaders to probe, among
            ``'train'``, ``'val'``, ``'test'``. Defaults to all three.
        memory_budget_mb (float, optional): budget for the batches in
            flight, in MiB, for all processes of this machine. Defaults to
            ``memory_fraction`` of the available RAM.
        memory_fraction (float): see ``memory_budget_mb``. Defaults to 0.5.
        cap_workers (bool): rebuild the loader with as many workers as fit
            the budget (at least 1). Defaults to False (only warn).
        paired (bool, optional): whether the data is paired (for
            ``'auto'``); detected from the dataset when None.
        policy (str, optional): the former name of ``probe``, accepted
            for one release with a warning that names ``probe``; elsewhere
            in mmsafe ``policy`` is what a guard does on a finding
            (``'warn'``/``'raise'``). Defaults to None.
    """

    guard_outputs = GuardOutputs(
        Section.LOADER_FALLBACKS,
        events=(Event.DATALOADER_PROBE, Event.DATALOADER_FALLBACK,
                Event.DATALOADER_LEAK, Event.DATALOADER_MEMORY),
        counters=(CounterKey.DATALOADER_PROBE, ))

    priority = 'VERY_HIGH'

    def __init__(self,
                 probe: str = 'auto',
                 timeout: float = 60.,
                 loaders: Sequence[str] = ('train', 'val', 'test'),
                 memory_budget_mb: Optional[float] = None,
                 memory_fraction: float = 0.5,
                 cap_workers: bool = False,
                 paired: Optional[bool] = None,
                 policy: Optional[str] = None) -> None:
        if policy is not None:
            if probe != 'auto':
                raise MMSafeValueError(
                    f'DataLoaderProbeHook: probe={probe!r} and policy='
                    f'{policy!r} given; policy is the former name of '
                    'probe: give probe only')
            log(f'DataLoaderProbeHook: policy={policy!r} is deprecated '
                f'and will be refused in a later release; write '
                f'probe={policy!r} (when the probe runs: one of '
                f'{PROBE_MODES}).', logging.WARNING)
            probe = policy
        if probe not in PROBE_MODES:
            raise MMSafeValueError(
                f'DataLoaderProbeHook: probe must be one of '
                f'{PROBE_MODES}, got {probe!r}')
        if timeout <= 0:
            raise MMSafeValueError('DataLoaderProbeHook: timeout must be > 0')
        unknown = set(loaders) - {'train', 'val', 'test'}
        if unknown:
            raise MMSafeValueError(f'DataLoaderProbeHook: unknown loaders '
                                   f'{sorted(unknown)}')
        self.probe = probe
        self.timeout = float(timeout)
        self.loaders = tuple(loaders)
        self.memory_budget_mb = memory_budget_mb
        self.memory_fraction = memory_fraction
        self.cap_workers = cap_workers
        self.paired = paired
        self._done: set = set()
        self._counts: Dict[str, Any] = dict(probed=0, passed=0, fallbacks=0,
                                            capped=0, memory_warnings=0,
                                            leaked_workers=0)

    def prepare_loader(self, runner, name: str,
                       loader: DataLoader) -> DataLoader:
        """Probe ``loader`` before its loop exists: the loader that the
        loop ``name`` will read (``loader``, or one rebuilt without or with
        fewer workers).

        Called by mmsafe's loops that start their loader's workers when
        they are built
        (:class:`~mmsafe.engine.loops.ResumableIterBasedTrainLoop`, which
        :class:`~mmsafe.engine.runner.SafeRunner` builds for
        ``IterBasedTrainLoop``), with the loader MMEngine built for them,
        before any worker exists; the loop's ``before_*`` probe is then
        done.
        """
        if not self._wants(name):
            return loader
        self._done.add(name)
        if not isinstance(loader, DataLoader) or loader.num_workers == 0:
            return loader
        with preserved_rng_state():
            return self._probe(runner, name, loader, None)

    def guard_status(self, runner) -> dict:
        """Inactive with ``probe='off'``; otherwise the model and data do
        not matter (a loader with workers is probed)."""
        if self.probe == 'off':
            return dict(status=INACTIVE, detail="probe='off'")
        return dict(status=ACTIVE, detail='every loader with workers is '
                    f'probed (probe={self.probe!r})')

    def before_train(self, runner) -> None:
        self._maybe_probe(runner, 'train', runner.train_loop)

    def before_val(self, runner) -> None:
        self._maybe_probe(runner, 'val', runner.val_loop)

    def before_test(self, runner) -> None:
        self._maybe_probe(runner, 'test', runner.test_loop)

    def _wants(self, name: str) -> bool:
        return self.probe != 'off' and name in self.loaders and \
            name not in self._done

    def _maybe_probe(self, runner, name: str, loop: Any) -> None:
        """Probe each named loader once, before its loop's first batch."""
        if loop is None or not self._wants(name):
            return
        self._done.add(name)
        loader = getattr(loop, 'dataloader', None)
        if not isinstance(loader, DataLoader) or loader.num_workers == 0:
            return
        if getattr(loop, 'dataloader_iterator', None) is not None:
            log(f'DataLoaderProbeHook: the {name} loop '
                f'({type(loop).__name__}) started its loader\'s workers when '
                'it was built, before this probe: a dataset they cannot '
                'receive (an unpicklable transform under spawn) ends the run '
                'there, before any fallback. runner_type=\'SafeRunner\' '
                'probes the loader before the loop starts them.',
                logging.WARNING)
        # Training finds every random stream (and with it the worker seeds
        # that the next epoch's iterator draws) as if no probe ran.
        with preserved_rng_state():
            self._probe(runner, name, loader, loop)

    def _probe(self, runner, name: str, loader: DataLoader,
               loop: Optional[Any]) -> DataLoader:
        """Probe ``loader``; returns the loader to read (replaced in
        ``loop`` too when the loop exists)."""
        method = start_method(loader)
        paired = self.paired if self.paired is not None else \
            is_paired_dataset(loader.dataset)
        settings = (f'num_workers={loader.num_workers}, persistent_workers='
                    f'{loader.persistent_workers}, prefetch_factor='
                    f'{loader.prefetch_factor}, start method {method!r}'
                    f'{", paired data" if paired else ""}')
        self._counts['probed'] += 1
        found = diagnose_loader(
            loader, self.timeout,
            on_warning=lambda text: log(f'DataLoaderProbeHook: the {name} '
                                        f'loader {text}', logging.WARNING),
            on_leak=lambda pids: self._check_leak(runner, name, pids))
        if found.verdict == 'fail':
            return self._fallback(runner, name, loader, loop, settings,
                                  found.cause, found.seconds)
        if found.verdict == 'not_probed':
            strict = self.probe == 'always' or (
                paired and method in PICKLING_START_METHODS)
            if strict:
                return self._fallback(
                    runner, name, loader, loop, settings,
                    f'{found.cause}, and workers are kept only when the '
                    'probe passes here', 0.0)
            log(f'DataLoaderProbeHook: the {name} loader was not probed '
                f'({found.cause}); keeping {settings}.', logging.WARNING)
            write_event(runner.work_dir, Event.DATALOADER_PROBE, loader=name,
                        result='not_probed', reason=found.cause)
            self._publish(name, 'not_probed', 0.0, None)
            return loader
        return self._passed(runner, name, loader, loop, settings, found)

    def _replace(self, runner, name: str, loop: Optional[Any],
                 new_loader: DataLoader, force: bool = False) -> None:
        """Make an existing ``loop`` read ``new_loader``."""
        if loop is not None:
            self._check_leak(runner, name, replace_loop_loader(
                loop, new_loader, force=force))

    def _passed(self, runner, name, loader, loop, settings,
                found) -> DataLoader:
        self._counts['passed'] += 1
        inflight = inflight_bytes(loader.num_workers, loader.prefetch_factor,
                                  found.batch_bytes)
        log(f'DataLoaderProbeHook: the {name} loader passed ({settings}): '
            f'first batches in {found.seconds:.1f} s, about '
            f'{found.batch_bytes / 2**20:.1f} MiB per batch, '
            f'{inflight / 2**20:.1f} MiB in flight on this machine.')
        write_event(runner.work_dir, Event.DATALOADER_PROBE, loader=name,
                    result='pass', seconds=round(found.seconds, 3),
                    batch_bytes=found.batch_bytes, inflight_bytes=inflight,
                    workers=loader.num_workers,
                    start_method=start_method(loader),
                    leaked_workers=len(found.leaked))
        self._publish(name, 'pass', found.seconds, inflight)
        return self._check_memory(runner, name, loader, loop,
                                  found.batch_bytes, inflight)

    def _fallback(self, runner, name, loader, loop, settings, cause: str,
                  seconds: float) -> DataLoader:
        new_loader = rebuild_loader(loader, num_workers=0)
        # workers that the loop already started (IterBasedTrainLoop starts
        # them when it is built) are of the kind that just failed: killed,
        # not asked politely and waited for
        alive = [] if loop is None else replace_loop_loader(
            loop, new_loader, force=True)
        self._check_leak(runner, name, alive)
        self._counts['fallbacks'] += 1
        key = f'{name}_dataloader'
        log('\n' + '!' * 72 + '\n'
            f'DataLoaderProbeHook: FALLING BACK to num_workers=0 for the '
            f'{name} loader ({settings}).\n'
            f'Cause: {cause}.\n'
            'Training continues without worker processes (slower, but it '
            'cannot deadlock).\n'
            f'To choose this yourself, set in the config: {key} = dict('
            'num_workers=0, persistent_workers=False)  (or --cfg-options '
            f'{key}.num_workers=0 {key}.persistent_workers=False); to turn '
            "the probe off: custom_hooks = [dict(type='DataLoaderProbeHook', "
            "probe='off')].\n" + '!' * 72, logging.WARNING)
        write_event(runner.work_dir, Event.DATALOADER_FALLBACK,
                    f'rank {get_rank()}: DataLoaderProbeHook fell back to '
                    f'num_workers=0 for the {name} loader ({settings}). '
                    f'Cause: {cause}.', logging.WARNING, loader=name,
                    cause=cause, seconds=round(seconds, 3),
                    settings=settings, leaked_workers=len(alive))
        self._publish(name, 'fallback', seconds, None)
        return new_loader

    def _check_leak(self, runner, name: str, alive: List[int]) -> None:
        if not alive:
            return
        self._counts['leaked_workers'] += len(alive)
        log(f'DataLoaderProbeHook: worker processes {alive} of the {name} '
            'loader are still alive after being killed.', logging.ERROR)
        write_event(runner.work_dir, Event.DATALOADER_LEAK, loader=name,
                    pids=list(alive))

    def _check_memory(self, runner, name, loader: DataLoader, loop,
                      batch_bytes: int, inflight: int) -> DataLoader:
        budget = budget_bytes(self.memory_budget_mb, self.memory_fraction)
        if budget is None or batch_bytes == 0 or inflight <= budget:
            return loader
        prefetch = loader.prefetch_factor or DEFAULT_PREFETCH
        fits = workers_that_fit(budget, loader.prefetch_factor, batch_bytes)
        key = f'{name}_dataloader'
        self._counts['memory_warnings'] += 1
        message = (
            f'DataLoaderProbeHook: the {name} loader keeps about '
            f'{inflight / 2**20:.1f} MiB of batches in flight '
            f'({local_processes()} process(es) x {loader.num_workers} '
            f'workers x prefetch_factor {prefetch} x '
            f'{batch_bytes / 2**20:.2f} MiB per batch, estimated from the '
            f'first batch), over the budget of {budget / 2**20:.1f} MiB. '
            f'{fits} worker(s) would fit: {key} = dict(num_workers={fits}) '
            '(or a smaller prefetch_factor).')
        write_event(runner.work_dir, Event.DATALOADER_MEMORY, loader=name,
                    inflight_bytes=inflight, budget_bytes=budget,
                    workers=loader.num_workers, workers_that_fit=fits)
        if not self.cap_workers or fits >= loader.num_workers:
            log(message, logging.WARNING)
            return loader
        new_loader = rebuild_loader(
            loader, num_workers=fits, prefetch_factor=loader.prefetch_factor,
            persistent_workers=loader.persistent_workers)
        self._replace(runner, name, loop, new_loader)
        self._counts['capped'] += 1
        log(message + f' Capped to {fits} worker(s) (cap_workers=True).',
            logging.WARNING)
        update_counters(CounterKey.DATALOADER_PROBE,
                        **{f'{name}_workers': fits})
        return new_loader

    def _publish(self, name: str, result: str, seconds: float,
                 inflight: Optional[int]) -> None:
        fields = dict(self._counts)
        fields[name] = result
        fields[f'{name}_probe_s'] = round(seconds, 3)
        if inflight is not None:
            fields[f'{name}_inflight_mb'] = round(inflight / 2**20, 2)
        update_counters(CounterKey.DATALOADER_PROBE, **fields)

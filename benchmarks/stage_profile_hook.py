"""Hooks of ``benchmarks/recipe_profile.py``: where one training process's
iterations go, measured in consecutive windows of one run. Configs load
them with ``custom_imports=dict(imports=['mmsafe',
'benchmarks.stage_profile_hook'])`` and list both hooks:
``StageProfileHook`` (``HIGHEST``: the first hook of an iteration) and
``StageProfileEndHook`` (``LOWEST``: the last).

The windows, in this order (iterations of the training loop):

1. ``warmup``: not measured (cuDNN's autotuning, the allocator's growth,
   the loader's start).
2. ``timed``: nothing added to the run. Paired samples/s and s/iteration
   over the window (one device synchronisation at each end of it), and the
   data wait of each iteration: from the end of the previous iteration's
   last hook to the start of this one's first, i.e. ``next()`` on the
   loader.
3. ``split``: the parts of an iteration timed one by one: the data
   preprocessor, each backbone, the necks, the fusion modules, the RPN,
   RoI and MACL heads' losses, the rest of ``train_step``'s forward, the
   backward, the optimizer step, and each mmsafe hook's iteration methods.
   Host clock for every part; on CUDA also the stream time between CUDA
   events recorded at the part's start and end (kernels plus any idle
   gaps), read after one synchronisation at the iteration's end.
4. ``count``: host synchronisations by origin (the innermost frame in
   mmsafe's models, MMDetection's models, mmsafe's guards, MMEngine or
   elsewhere): tensor-to-host conversions (``.item()``, ``.tolist()``,
   ``.cpu()``, ``.numpy()``, ``float()``, ``int()``, ``bool()``) on every
   device, and on CUDA every synchronising CUDA call (``torch.cuda``'s
   sync debug mode).
5. ``profile`` (CUDA only): ``torch.profiler`` over the window; the GPU
   busy fraction is the union of the kernels' time intervals over the
   window's wall time.

The figures go to ``{work_dir}/stage_profile.json`` at the end of the last
window (rank 0; the script profiles one process).
"""
import json
import os
import os.path as osp
import sys
import time
import warnings
from collections import Counter, defaultdict
from typing import Callable, Dict, List, Optional

from mmengine.hooks import Hook

from mmdet.registry import HOOKS

# the tensor-to-host conversions that guard_overhead.py counts too
from benchmarks._common import _SYNC_METHODS, MethodCounter

WINDOWS = ('warmup', 'timed', 'split', 'count', 'profile')

#: model parts timed in the split window: (label, attribute path on the
#: model, method); a part the model lacks is left out
MODEL_PARTS = (
    ('data preprocessor', 'data_preprocessor', 'forward'),
    ('visible backbone', 'backbone', 'forward'),
    ('infrared backbone', 'ir_backbone', 'forward'),
    ('necks', 'neck', 'forward'),
    ('necks', 'ir_neck', 'forward'),
    ('fusion', 'fusions', 'forward'),
    ('RPN head (loss)', 'rpn_head', 'loss_and_predict'),
    ('RoI head (loss)', 'roi_head', 'loss'),
    ('MACL head (loss)', 'macl_head', 'loss'),
)
OPTIM_PARTS = (('backward', 'backward'), ('optimizer step', 'step'),
               ('zero_grad', 'zero_grad'))
#: the iteration methods of a hook that run at every training step
HOOK_METHODS = ('before_train_iter', 'after_train_iter')


def _package_dir(name: str) -> Optional[str]:
    module = sys.modules.get(name)
    path = getattr(module, '__file__', None)
    return osp.dirname(path) + os.sep if path else None


class SyncOrigins:
    """Origin of a host synchronisation from the live Python stack: the
    innermost frame in mmsafe's models, MMDetection's models, mmsafe's
    guards (any other mmsafe code), MMEngine or MMCV; a synchronisation in
    torch's own Python code (an optimizer's step, a norm) is labelled
    ``torch (via ...)`` with the first of those frames that called it;
    ``elsewhere`` when none of them is on the stack."""

    def __init__(self) -> None:
        mmsafe = _package_dir('mmsafe')
        mmdet = _package_dir('mmdet')
        self.kinds = []
        if mmsafe:
            self.kinds += [(osp.join(mmsafe, 'models') + os.sep,
                            'model (mmsafe)'), (mmsafe, 'guards (mmsafe)')]
        if mmdet:
            self.kinds.append((osp.join(mmdet, 'models') + os.sep,
                               'model (MMDetection)'))
            self.kinds.append((mmdet, 'MMDetection (other)'))
        for name, label in (('mmengine', 'MMEngine'), ('mmcv', 'MMCV')):
            where = _package_dir(name)
            if where:
                self.kinds.append((where, label))
        self.torch_dir = _package_dir('torch')
        self.this_file = osp.abspath(__file__)

    def __call__(self, frame) -> str:
        in_torch = None
        while frame is not None:
            filename = osp.abspath(frame.f_code.co_filename)
            if filename != self.this_file:
                where = (f'{osp.basename(filename)}:{frame.f_code.co_name}:'
                         f'{frame.f_lineno}')
                for prefix, label in self.kinds:
                    if filename.startswith(prefix):
                        if in_torch:
                            return f'torch (via {label}) {in_torch}<-{where}'
                        return f'{label} {where}'
                if in_torch is None and self.torch_dir and \
                        filename.startswith(self.torch_dir):
                    in_torch = where
            frame = frame.f_back
        return f'torch (via elsewhere) {in_torch}' if in_torch else \
            'elsewhere'


class SyncCounter(MethodCounter):
    """Counts, while installed, tensor-to-host conversions and (on CUDA)
    synchronising CUDA calls, each keyed by its origin."""

    def __init__(self, cuda: bool) -> None:
        super().__init__()
        self.cuda = cuda
        self.origins = SyncOrigins()
        self.conversions: Counter = Counter()
        self.cuda_syncs: Counter = Counter()
        self._warnings = None

    def install(self) -> None:
        import torch
        origins = self.origins

        def key(name, frame):
            return f'{name} @ {origins(frame)}'

        for name in _SYNC_METHODS:
            self.count(torch.Tensor, name, self.conversions, key)
        if self.cuda:
            self._warnings = warnings.catch_warnings()
            self._warnings.__enter__()
            warnings.simplefilter('always')
            previous = warnings.showwarning

            def show(message, category, filename, lineno, file=None,
                     line=None):
                if 'synchronizing CUDA operation' in str(message):
                    # called from inside the synchronising call: the
                    # stack is the call's
                    self.cuda_syncs[self.origins(sys._getframe(1))] += 1
                else:
                    previous(message, category, filename, lineno, file,
                             line)

            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode('warn')

    def remove(self) -> None:
        import torch
        if self.cuda:
            torch.cuda.set_sync_debug_mode('default')
            self._warnings.__exit__(None, None, None)
            self._warnings = None
        super().remove()


def _kind(site: str) -> str:
    """``model (mmsafe) gather.py:f:12`` -> ``model (mmsafe)``."""
    return site.rsplit(' ', 1)[0] if ' ' in site else site


class _Timer:
    """Host clock (and CUDA events) of the parts of the split window."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.host: Dict[str, float] = defaultdict(float)
        self.events: List = []
        self.active = False

    def wrap(self, label: str, fn: Callable) -> Callable:
        timer = self

        def timed(*args, **kwargs):
            if not timer.active:
                return fn(*args, **kwargs)
            start_event = None
            if timer.cuda:
                import torch
                start_event = torch.cuda.Event(enable_timing=True)
                start_event.record()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timer.host[label] += time.perf_counter() - start
                if start_event is not None:
                    import torch
                    end_event = torch.cuda.Event(enable_timing=True)
                    end_event.record()
                    timer.events.append((label, start_event, end_event))

        timed.__wrapped__ = fn
        return timed

    def collect(self) -> Dict[str, Dict[str, float]]:
        """This iteration's milliseconds per part (host, and stream on
        CUDA, after one synchronisation); resets."""
        device: Dict[str, float] = defaultdict(float)
        if self.cuda and self.events:
            import torch
            torch.cuda.synchronize()
            for label, start, end in self.events:
                device[label] += start.elapsed_time(end)
        out = {label: dict(host_ms=seconds * 1e3)
               for label, seconds in self.host.items()}
        for label, ms in device.items():
            out[label]['device_ms'] = ms
        self.host = defaultdict(float)
        self.events = []
        return out


def channels_last_weights(model) -> tuple:
    """``(channels-last, all)`` of ``model``'s 4-D weights whose two layouts
    differ (a 1x1 kernel's are the same)."""
    import torch
    layout = torch.channels_last
    weights = [p for p in model.parameters() if p.dim() == 4 and not (
        p.is_contiguous() and p.is_contiguous(memory_format=layout))]
    return sum(p.is_contiguous(memory_format=layout) for p in weights), \
        len(weights)


def _busy_fraction(prof, wall_us: float) -> Optional[float]:
    """Union of the CUDA kernels' intervals over ``wall_us``; None when the
    profiler reported no kernel."""
    import torch
    intervals = []
    for event in prof.events():
        if getattr(event, 'device_type', None) == \
                torch.autograd.DeviceType.CUDA:
            intervals.append((event.time_range.start, event.time_range.end))
    if not intervals or wall_us <= 0:
        return None
    intervals.sort()
    busy, (lo, hi) = 0.0, intervals[0]
    for start, end in intervals[1:]:
        if start > hi:
            busy += hi - lo
            lo, hi = start, end
        else:
            hi = max(hi, end)
    busy += hi - lo
    return busy / wall_us


@HOOKS.register_module()
class StageProfileHook(Hook):
    """The first hook of every iteration (``HIGHEST``); the measuring
    windows of the module docstring, ``warmup`` ... ``profile`` iterations
    each (``profile`` runs on CUDA only)."""

    priority = 'HIGHEST'

    def __init__(self, warmup: int = 5, timed: int = 20, split: int = 5,
                 count: int = 2, profile: int = 5) -> None:
        self.sizes = dict(warmup=warmup, timed=timed, split=split,
                          count=count, profile=profile)
        self.step = 0
        self.result: Dict = dict(windows=dict(self.sizes), data_wait_ms=[],
                                 split=[], pairs=0)
        self._last_end: Optional[float] = None
        self._window_start: Optional[float] = None
        self._prof = None
        self._sync: Optional[SyncCounter] = None

    # windows
    def window(self, step: Optional[int] = None) -> Optional[str]:
        step = self.step if step is None else step
        for name in WINDOWS:
            size = self.sizes[name]
            if name == 'profile' and not self.cuda:
                size = 0
            if step < size:
                return name
            step -= size
        return None

    def before_train(self, runner) -> None:
        import torch
        from mmengine.model import is_model_wrapper
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        device = next(model.parameters()).device
        self.cuda = device.type == 'cuda'
        self.result['device'] = str(device)
        self.timer = _Timer(self.cuda)
        parts = []
        for label, path, method in MODEL_PARTS:
            owner = getattr(model, path, None)
            owners = list(owner) if isinstance(owner, torch.nn.ModuleList) \
                else [owner]
            for item in owners:
                if item is not None and hasattr(item, method):
                    setattr(item, method,
                            self.timer.wrap(label, getattr(item, method)))
                    parts.append(label)
        model.train_step = self.timer.wrap('train_step', model.train_step)
        wrapper = runner.optim_wrapper
        for label, method in OPTIM_PARTS:
            setattr(wrapper, method,
                    self.timer.wrap(label, getattr(wrapper, method)))
        guards = []
        for hook in runner.hooks:
            if not type(hook).__module__.startswith('mmsafe.'):
                continue
            for method in HOOK_METHODS:
                # only the methods the guard overrides (not Hook's no-ops)
                if getattr(type(hook), method) is not getattr(Hook, method):
                    setattr(hook, method, self.timer.wrap(
                        f'guard {type(hook).__name__}',
                        getattr(hook, method)))
            guards.append(type(hook).__name__)
        nhwc, total = channels_last_weights(model)
        self.result.update(
            channels_last_weights=f'{nhwc}/{total}',
            model_parts=sorted(set(parts)), guards=guards,
            optim_wrapper=type(wrapper).__name__,
            runner=type(runner).__name__,
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark))

    def _sync_device(self) -> None:
        if self.cuda:
            import torch
            torch.cuda.synchronize()

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        now = time.perf_counter()
        name = self.window()
        if name == 'timed':
            if self.window(self.step - 1) != 'timed':
                self._sync_device()
                self._window_start = time.perf_counter()
            elif self._last_end is not None:
                self.result['data_wait_ms'].append(
                    (now - self._last_end) * 1e3)
            self.result['pairs'] += len(data_batch['data_samples'])
        elif name == 'split':
            self.timer.active = True
        elif name == 'count':
            if self._sync is None:
                self._sync = SyncCounter(self.cuda)
            self._sync.install()
        elif name == 'profile' and self._prof is None:
            from torch.profiler import ProfilerActivity, profile
            self._sync_device()
            self._prof = profile(activities=[ProfilerActivity.CPU,
                                             ProfilerActivity.CUDA])
            self._prof.__enter__()
            self._window_start = time.perf_counter()

    def iteration_end(self, runner) -> None:
        """Called by :class:`StageProfileEndHook` after every other hook of
        the iteration."""
        name = self.window()
        if name == 'timed' and self.window(self.step + 1) != 'timed':
            self._sync_device()
            wall = time.perf_counter() - self._window_start
            self.result.update(timed_s=wall,
                               s_per_iter=wall / self.sizes['timed'],
                               pairs_per_s=self.result['pairs'] / wall)
        elif name == 'split':
            self.timer.active = False
            self.result['split'].append(self.timer.collect())
        elif name == 'count':
            # counted inside the iterations only, not the loader's next()
            self._sync.remove()
            if self.window(self.step + 1) != 'count':
                iters = self.sizes['count']
                for key, counter in (('conversions', self._sync.conversions),
                                     ('cuda_syncs', self._sync.cuda_syncs)):
                    self.result[key] = {k: v / iters
                                        for k, v in counter.items()}
        elif name == 'profile' and self.window(self.step + 1) != 'profile':
            self._sync_device()
            wall_us = (time.perf_counter() - self._window_start) * 1e6
            self._prof.__exit__(None, None, None)
            self.result['gpu_busy'] = _busy_fraction(self._prof, wall_us)
            self._prof = None
        if self.cuda:
            import torch
            self.result['peak_memory_mib'] = \
                torch.cuda.max_memory_allocated() / 2**20
        self.step += 1
        self._last_end = time.perf_counter()
        if self.window() is None and 'written' not in self.result:
            self.result['written'] = True
            self._write(runner)

    def _write(self, runner) -> None:
        for key in ('conversions', 'cuda_syncs'):
            by_kind: Counter = Counter()
            for site, n in self.result.get(key, {}).items():
                by_kind[_kind(site.split(' @ ')[-1])] += n
            self.result[f'{key}_by_kind'] = dict(by_kind)
        if runner.rank == 0:
            path = osp.join(runner.work_dir, 'stage_profile.json')
            with open(path, 'w', encoding='utf-8') as f:
                json.dump(self.result, f, indent=1, sort_keys=True)


@HOOKS.register_module()
class StageProfileEndHook(Hook):
    """The last hook of every iteration (``LOWEST``): ends the iteration
    of the run's :class:`StageProfileHook`."""

    priority = 'LOWEST'

    def before_train(self, runner) -> None:
        partners = [h for h in runner.hooks
                    if isinstance(h, StageProfileHook)]
        if len(partners) != 1:
            raise RuntimeError('StageProfileEndHook needs exactly one '
                               f'StageProfileHook, found {len(partners)}')
        self.partner = partners[0]

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        self.partner.iteration_end(runner)

"""Name a fault of one rank: a loss term it stopped producing, the modules
that got no gradient there, and DDP's unused-parameter error explained.

:class:`LossTermWatch` follows which loss terms a rank produced, iteration
by iteration, and which parameters they reach; :func:`ddp_error_kind`,
:func:`parameter_indices` and :func:`names_for_indices` read PyTorch's DDP
reducer errors back into the parameters and modules they name;
:class:`RankFaultHook` runs both and reports.
"""
import logging
import re
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import torch
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmsafe.registry import HOOKS
from mmsafe.compat import ddp_reduction_check
from mmsafe.dist import get_rank, get_world_size, is_distributed
from mmsafe.engine.loss_graph import as_tensors, loss_keys, walk_autograd
from mmsafe.engine.run_context import run_context
from mmsafe.engine.runner.errors import DDPParameterError
from mmsafe.engine.utils import unwrap_model
from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import batch_file_names, update_counters, write_event

#: Substrings of DDP's reducer errors about unused or reused parameters.
UNUSED_MARKERS = (
    'Expected to have finished reduction in the prior iteration',
    'parameters that were not used in producing loss',
    'did not receive grad',
)
TWICE_MARKERS = (
    'marked as ready twice',
    'Expected to mark a variable ready only once',
)

_INDICES = re.compile(
    r'Parameter indices which did not receive grad for rank (\d+):'
    r'((?:\s+\d+)+)')
_TWICE = re.compile(r'Parameter at index (\d+)')


def ddp_error_kind(exc: BaseException) -> Optional[str]:
    """``'unused'`` or ``'twice'`` for DDP's parameter errors, else None."""
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    if any(marker in text for marker in UNUSED_MARKERS):
        return 'unused'
    if any(marker in text for marker in TWICE_MARKERS):
        return 'twice'
    return None


def parameter_indices(message: str) -> List[int]:
    """The parameter indices that DDP's message names (unused or twice)."""
    found = _INDICES.search(message)
    if found:
        return [int(i) for i in found.group(2).split()]
    return [int(i) for i in _TWICE.findall(message)]


def reducer_parameter_names(module: nn.Module,
                            ignore: Optional[set] = None) -> List[str]:
    """Names of ``module``'s parameters in DDP's reducer order; ``ignore``:
    DDP's ``parameters_to_ignore``.

    DDP reports a parameter that got no gradient on a rank (or one that got
    two) by its index in the reducer's parameter list: "Parameter indices
    which did not receive grad for rank 1: 6 7 8 ...", "Parameter at index
    12 ... has been marked as ready twice". The names appear only with
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL``. The reducer's list is built by one
    rule on every supported torch: the wrapped module's
    ``named_modules()``, each module's own parameters that require grad and
    are not in ``parameters_to_ignore``, the first occurrence of a shared
    parameter only.
    """
    ignore = set(ignore or ())
    names, seen = [], set()
    for module_name, sub in module.named_modules():
        for param_name, param in sub.named_parameters(recurse=False):
            full = f'{module_name}.{param_name}' if module_name \
                else param_name
            # DDP compares '{module_name}.{param_name}', with a leading dot
            # for the root module's own parameters.
            if not param.requires_grad or \
                    f'{module_name}.{param_name}' in ignore:
                continue
            if id(param) in seen:
                continue
            seen.add(id(param))
            names.append(full)
    return names


def names_for_indices(wrapper: nn.Module, indices: List[int]) -> List[str]:
    """Parameter names of a DDP wrapper's reducer ``indices``."""
    module = getattr(wrapper, 'module', wrapper)
    names = reducer_parameter_names(
        module, getattr(wrapper, 'parameters_to_ignore', None))
    return [names[i] for i in indices if 0 <= i < len(names)]


def unfinished_reduction_error(wrapper: nn.Module, unreached: List[str],
                               rank: int) -> RuntimeError:
    """DDP's unused-parameter error, for a torch whose DDP cannot check its
    reducer locally (torch 2.0 has no ``_check_reducer_finalized``).

    Without ``find_unused_parameters``, a parameter that the loss reached
    before and no longer reaches leaves this rank's gradient all-reduce
    unfinished: DDP fails at the next iteration, and the other ranks' next
    collective meets the unfinished one (torch 2.0's gloo then aborts the
    process). The error is DDP's own message, with the reducer indices of
    ``unreached`` (see :func:`reducer_parameter_names`), so that it reads
    and is explained as DDP's.

    Args:
        wrapper (nn.Module): the DDP wrapper.
        unreached (list[str]): names of the parameters the loss no longer
            reaches, as the wrapped module names them.
        rank (int): this rank.
    """
    module = getattr(wrapper, 'module', wrapper)
    order = reducer_parameter_names(
        module, getattr(wrapper, 'parameters_to_ignore', None))
    wanted = set(unreached)
    indices = ' '.join(str(i) for i, name in enumerate(order)
                       if name in wanted)
    return RuntimeError(
        'Expected to have finished reduction in the prior iteration before '
        'starting a new one. This error indicates that your module has '
        'parameters that were not used in producing loss (found from the '
        'loss graph: this torch\'s DDP has no local check of its reducer). '
        f'Parameter indices which did not receive grad for rank {rank}: '
        f'{indices}')


def _requires_grad(value) -> bool:
    tensors = as_tensors(value)
    return bool(tensors) and any(t.requires_grad for t in tensors)


def reached_parameters(losses: dict, limit: int = 1000000) -> Set[int]:
    """Ids of the parameters (autograd leaves) that the loss terms of
    ``losses`` reach; the graph is only inspected."""
    roots = []
    reached: Set[int] = set()
    for key in loss_keys(losses):
        for tensor in as_tensors(losses[key]):
            if tensor.grad_fn is not None:
                roots.append(tensor.grad_fn)
            elif tensor.requires_grad:
                reached.add(id(tensor))

    def visit(fn) -> bool:
        variable = getattr(fn, 'variable', None)
        if isinstance(variable, torch.Tensor):
            reached.add(id(variable))
        return True

    walk_autograd(roots, visit, limit)
    return reached


def group_by_module(names: Iterable[str], model: nn.Module) -> List[str]:
    """The shortest description of parameter ``names`` by modules: a module
    all of whose trainable parameters are in ``names`` is named once (its
    children not); the rest by parameter, with its module.

    Returns:
        list[str]: e.g. ``['macl_head (13 parameters)',
        'roi_head.bbox_head.fc_cls.weight']``.
    """
    wanted = set(names)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    covered: Set[str] = set()
    out: List[str] = []
    for module_name, module in model.named_modules():
        prefix = f'{module_name}.' if module_name else ''
        own = [f'{prefix}{n}' for n, p in module.named_parameters()
               if p.requires_grad]
        own = [n for n in own if n in trainable]
        if not own or not module_name or any(n in covered for n in own):
            continue
        if all(n in wanted for n in own):
            covered.update(own)
            count = len(own)
            out.append(f'{module_name} ({count} parameter'
                       f'{"s" if count != 1 else ""})')
    out.extend(sorted(n for n in wanted if n not in covered))
    return out


class LossTermWatch:
    """The loss terms of one rank over a run.

    Under DDP every rank must back-propagate into the same parameters in
    every iteration: a term that one rank leaves out of its loss dict (a
    swallowed exception, a branch that returns early for some batches, a
    constant placeholder) leaves that branch's parameters without a
    gradient there, and DDP either fails one iteration later ("Expected to
    have finished reduction in the prior iteration ...") or, with
    ``find_unused_parameters=True``, trains on silently without that term
    on that rank.

    Each iteration's terms are compared with the rank's earlier ones: on a
    healthy step, two small sets of key names (no device read, no
    collective). Only when they differ is the autograd graph walked
    (inspected, never run) to name the modules that the loss no longer
    reaches.

    Call :meth:`observe` with each training iteration's loss dict (before
    backward, while its graph is alive).
    """

    def __init__(self) -> None:
        self.known: Set[str] = set()  # every loss key seen so far
        self.with_grad: Set[str] = set()  # ... that carried a gradient
        self.first_iter: Optional[int] = None
        self.last_iter: Optional[int] = None
        self.last_keys: List[str] = []
        self.last_detached: List[str] = []
        self._last_sig: Optional[Tuple[frozenset, frozenset]] = None
        self._baseline_reached: Optional[Set[int]] = None
        self.changes: List[Dict] = []
        self.faulty = False  # the latest observed iteration differs

    def observe(self, iteration: int, losses: dict,
                params: Dict[int, str]) -> Optional[Dict]:
        """Record one iteration's loss dict.

        Args:
            iteration (int): the training iteration (1-based).
            losses (dict): the loss dict, graph alive.
            params (dict): ``id(parameter) -> name`` of the trainable
                parameters.

        Returns:
            dict or None: on a change (terms missing, new, or without
            gradient compared with this rank's earlier iterations; or back
            to normal) what changed, including the modules the loss no
            longer reaches; None when nothing changed.
        """
        keys = loss_keys(losses)
        detached = [k for k in keys if not _requires_grad(losses[k])]
        sig = (frozenset(keys), frozenset(detached))
        first = self.first_iter is None
        if first:
            self.first_iter = iteration
            self._baseline_reached = reached_parameters(losses)
        self.last_iter = iteration
        if sig == self._last_sig:
            return None
        self._last_sig = sig
        self.last_keys, self.last_detached = keys, detached
        missing = sorted(self.known - set(keys))
        new = [] if first else sorted(set(keys) - self.known)
        lost_grad = sorted(set(detached) & self.with_grad)
        self.known.update(keys)
        self.with_grad.update(k for k in keys if k not in detached)
        if first:
            return None
        faulty = bool(missing or lost_grad)
        if not faulty and not self.faulty and not new:
            return None
        unreached: List[str] = []
        if faulty and self._baseline_reached is not None:
            now = reached_parameters(losses)
            unreached = sorted(params[i] for i in self._baseline_reached
                               if i not in now and i in params)
        change = dict(iter=iteration, keys=keys, missing=missing, new=new,
                      detached=lost_grad, unreached=unreached,
                      restored=not faulty and self.faulty)
        self.faulty = faulty
        self.changes.append(change)
        return change


_POLICIES = ('warn', 'raise')

_FIX = (
    'Every rank must return every loss term, connected to the same '
    'parameters, in every iteration. Find why {what} on rank {rank} in '
    'iteration {it}{files}: an exception caught around a loss, a branch '
    'that returns early for some batches, a loss replaced by a constant. '
    'When a branch has nothing to compute, return its losses as a zero '
    'that stays connected to its parameters (e.g. '
    '`sum(p.sum() for p in branch.parameters()) * 0`); for batches without '
    'ground truth mmsafe\'s EmptyBatchSyncHook does that. '
    'find_unused_parameters=True does not fix this: it hides it (the term '
    'then trains on some ranks and silently not on others).')

_TWICE_FIX = (
    'A parameter received its gradient twice in one backward pass on rank '
    '{rank}. Usual causes: activation checkpointing with '
    'use_reentrant=True (use use_reentrant=False, or '
    'model_wrapper_cfg=dict(type=\'MMDistributedDataParallel\', '
    'static_graph=True)), a module run twice in one forward with '
    'find_unused_parameters=True, or a parameter shared between modules '
    'and used outside forward.')


def _iterations(first: int, last: int) -> str:
    """``'iterations 1-12'`` or ``'iteration 1'``."""
    return (f'iterations {first}-{last}' if first < last else
            f'iteration {first}')


def _join(items: List[str], limit: int = 12) -> str:
    if not items:
        return 'none'
    more = len(items) - limit
    return ', '.join(items[:limit]) + (f' (+{more} more)' if more > 0
                                       else '')


@HOOKS.register_module()
class RankFaultHook(Hook):
    """Watch each rank's loss terms for the whole run, and explain DDP's
    errors about parameters without (or with double) gradients.

    :class:`~mmsafe.engine.runner.SafeRunner` adds one to every run that
    does not configure it.

    * **Every iteration, on every rank**: the keys of the loss dict that
      ``parse_losses`` sums (those containing ``'loss'``) and whether each
      carries a gradient are compared with the rank's earlier iterations, in
      a forward hook on the (wrapped) model: two small sets of names, no
      device read, no collective. A term that goes missing, or stops
      carrying a gradient, is reported at once, naming rank, iteration,
      term, the modules the loss no longer reaches (from the autograd
      graph, inspected only then), the batch's files and the fix: in this
      rank's log, ``mmsafe_events.jsonl`` (``rank_fault_loss_terms``),
      ``safety_report.json`` and, under DDP, on rank 0's console and log
      (:mod:`~mmsafe.engine.rank_channel`). With
      ``find_unused_parameters=True`` such a fault does not stop the run,
      so this is where it shows. New terms and the return to normal are
      reported too.
    * **When DDP fails** with "Expected to have finished reduction in the
      prior iteration ..." (parameters that got no gradient on a rank) or
      "... marked as ready twice", :meth:`explain_failure` turns PyTorch's
      message into one that names the rank, the iteration, the loss terms
      of that rank in that iteration compared with its earlier iterations
      and with the other ranks, the modules whose parameters got no
      gradient (names, from DDP's parameter indices: no
      ``TORCH_DISTRIBUTED_DEBUG`` needed) and the fix. SafeRunner raises
      it in place of PyTorch's error and puts it into
      ``safety_report.json``.

    Args:
        policy (str): ``'warn'`` (default) reports a changed loss dict;
            ``'raise'`` also stops the run on that rank (the other ranks
            then stop within seconds, naming it).
    """

    guard_outputs = GuardOutputs(
        Section.RANK_FAULTS,
        events=(Event.RANK_FAULT_LOSS_TERMS, ),
        counters=(CounterKey.RANK_FAULTS, ))

    # after_train_iter runs before the other hooks' (their monitoring
    # sync must not meet a rank whose gradient reduction is unfinished)
    priority = 'VERY_HIGH'

    def __init__(self, policy: str = 'warn') -> None:
        if policy not in _POLICIES:
            raise MMSafeValueError(f'RankFaultHook.policy must be one of '
                                   f'{_POLICIES}, got {policy!r}')
        self.policy = policy
        self.watch = LossTermWatch()
        self._handle = None
        self._params: Dict[int, str] = {}
        self._in_iter = False
        self._iteration = 0
        self._samples: Any = None
        self._channel = None
        self._model = None
        self._reduction_check = None
        self._graph_check = False
        self._work_dir: Optional[str] = None
        self.counters: Dict[str, int] = dict(faulty_iters=0, changes=0)

    # ------------------------------------------------------------------ #
    def before_run(self, runner) -> None:
        self._channel = run_context(runner).rank_channel
        self._work_dir = runner.work_dir

    def before_train(self, runner) -> None:
        model = unwrap_model(runner.model)
        self._model = model
        self._reduction_check = ddp_reduction_check(runner.model)
        # DDP without find_unused_parameters on a torch without the local
        # reducer check: the loss graph tells the same (after_train_iter)
        self._graph_check = (self._reduction_check is None
                             and is_model_wrapper(runner.model)
                             and hasattr(runner.model, 'reducer')
                             and not getattr(runner.model,
                                             'find_unused_parameters', True))
        self._params = {id(p): name for name, p in model.named_parameters()
                        if p.requires_grad}

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        if self._handle is None:
            # Registered after every hook's before_train, so that it sees
            # the loss dict after their forward hooks (EmptyBatchSyncHook's
            # fill), as DDP and the backward see it.
            self._handle = runner.model.register_forward_hook(
                self._observe, with_kwargs=True)
        self._in_iter = True
        self._iteration = runner.iter + 1

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        self._in_iter = False
        if self._reduction_check is not None:
            # A local check of DDP's reducer: a rank whose backward left
            # parameters without gradient fails here, in the iteration of
            # the fault, before any other collective can meet the
            # unfinished gradient all-reduce of the other ranks.
            self._reduction_check()
        elif self._graph_check:
            change = self.watch.changes[-1] if self.watch.changes else None
            if change is not None and change['iter'] == self._iteration \
                    and change['unreached']:
                raise unfinished_reduction_error(
                    runner.model, change['unreached'], get_rank())
        if self.watch.faulty:
            self.counters['faulty_iters'] += 1
        update_counters(CounterKey.RANK_FAULTS, **self.counters)

    def after_train(self, runner) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # ------------------------------------------------------------------ #
    def _observe(self, module, args, kwargs, output) -> None:
        mode = kwargs.get('mode', args[2] if len(args) > 2 else None)
        if (not self._in_iter or mode != 'loss' or not module.training
                or not isinstance(output, dict)):
            return
        self._samples = kwargs.get('data_samples',
                                   args[1] if len(args) > 1 else None)
        first = self.watch.first_iter is None
        change = self.watch.observe(self._iteration, output, self._params)
        if first or change is not None:
            self._publish_terms()
        if change is not None:
            self._report(change)

    def _files(self) -> List[str]:
        return batch_file_names(dict(data_samples=self._samples or []))

    def _publish_terms(self) -> None:
        if self._channel is None:
            return
        watch = self.watch
        self._channel.set_value(
            f'loss_terms/{get_rank()}',
            dict(iter=watch.last_iter, keys=watch.last_keys,
                 detached=watch.last_detached))

    def _report(self, change: Dict) -> None:
        rank, it = get_rank(), change['iter']
        self.counters['changes'] += 1
        count = self.counters['changes']
        if count > 8 and count & (count - 1):
            return  # a flapping loss dict: reported at powers of two
        files = self._files() if not change['restored'] else []
        if change['restored']:
            message = (f'rank {rank}, iteration {it}: the loss dict is back '
                       f'to its usual terms ({_join(change["keys"])}).')
            level = logging.WARNING
        else:
            message = self._describe(change, rank, files)
            level = logging.ERROR if (change['missing']
                                      or change['detached']) \
                else logging.WARNING
        if count > 1:
            message += f' [change {count} of the loss dict on this rank]'
        write_event(self._work_dir, Event.RANK_FAULT_LOSS_TERMS, message,
                    level, **change, files=files)
        if self.policy == 'raise' and (change['missing']
                                       or change['detached']):
            raise MMSafeRuntimeError(f'[mmsafe] {message}\nSet RankFaultHook '
                                     "policy='warn' to only report this.")

    def _describe(self, change: Dict, rank: int, files: List[str]) -> str:
        watch, it = self.watch, change['iter']
        since = _iterations(watch.first_iter, it - 1)
        parts = []
        if change['missing']:
            parts.append(f'{_join(change["missing"])} missing from the loss '
                         f'dict (present in this rank\'s {since})')
        if change['detached']:
            parts.append(f'{_join(change["detached"])} without gradient '
                         '(a constant or detached value; it carried one in '
                         f'this rank\'s {since})')
        if change['new']:
            parts.append(f'new term(s) {_join(change["new"])}')
        text = f'rank {rank}, iteration {it}: loss term ' + '; '.join(parts)
        if change['missing'] or change['detached']:
            unreached = _join(self._modules(change['unreached'])) \
                if change['unreached'] else 'no parameter it reached before'
            text += f'. The loss no longer reaches: {unreached}. '
            if is_distributed():
                text += ('Under DDP with find_unused_parameters=False the '
                         'run fails at the next iteration; with True this '
                         'rank trains without it, silently. ')
            what = (f'{_join(change["missing"] + change["detached"])} '
                    'was not computed')
            text += _FIX.format(what=what, rank=rank, it=it,
                                files=f' (files: {_join(files, 4)})'
                                if files else '')
        else:
            text += ('. If the other ranks do not produce it as well, DDP '
                     'fails at the next iteration.')
        return text

    def _modules(self, names: List[str]) -> List[str]:
        if not names or self._model is None:
            return []
        return group_by_module(names, self._model)

    # ------------------------------------------------------------------ #
    def explain_failure(self, runner,
                        exc: BaseException) -> Optional[Dict]:
        """What this rank knows about DDP's parameter error ``exc``
        (:class:`~mmsafe.engine.runner.SafeRunner` asks every hook that has
        this method when a run fails).

        Returns:
            dict or None: ``error``, a
            :class:`~mmsafe.engine.runner.errors.DDPParameterError` whose
            message is the explanation (PyTorch's message last), and the
            fields of ``safety_report.json``'s root cause; None when ``exc``
            is not such an error.
        """
        kind = ddp_error_kind(exc)
        if kind is None:
            return None
        rank, watch = get_rank(), self.watch
        it = watch.last_iter
        indices = parameter_indices(str(exc))
        names = names_for_indices(runner.model, indices)
        modules = group_by_module(names, unwrap_model(runner.model))
        change = watch.changes[-1] if watch.changes and \
            watch.changes[-1]['iter'] == it else None
        others = self._other_ranks()
        files = self._files()
        lines = []
        if kind == 'unused':
            lines.append(
                f'[mmsafe] DDP stopped: on rank {rank}, in iteration {it}, '
                'the parameters of '
                f'{_join(modules) if modules else "some modules"} got no '
                'gradient, while the other ranks waited for them in '
                'the gradient all-reduce (PyTorch: "Expected to have '
                'finished reduction in the prior iteration ...").')
        else:
            lines.append(
                f'[mmsafe] DDP stopped: on rank {rank}, in iteration {it}, '
                f'{_join(modules) if modules else "a parameter"} got its '
                'gradient twice in one backward pass (PyTorch: "... marked '
                'as ready twice").')
        lines.append(f'Loss terms of rank {rank} in iteration {it}: '
                     f'{_join(watch.last_keys, 20)}.')
        if change is not None and (change['missing'] or change['detached']):
            earlier = []
            if change['missing']:
                earlier.append(f'{_join(change["missing"])} missing')
            if change['detached']:
                earlier.append(f'{_join(change["detached"])} without '
                               'gradient')
            lines.append(
                '  compared with its '
                f'{_iterations(watch.first_iter, it - 1)}: ' +
                ', '.join(earlier) + '.')
        elif watch.first_iter is not None and it is not None \
                and it > watch.first_iter:
            lines.append('  compared with its '
                         f'{_iterations(watch.first_iter, it - 1)}: the '
                         'same terms.')
        for other, terms in sorted(others.items()):
            if terms is None:
                lines.append(f'  rank {other}: not known.')
                continue
            theirs = set(terms.get('keys', []))
            lacks = sorted(theirs - set(watch.last_keys))
            extra = sorted(set(watch.last_keys) - theirs)
            diff = []
            if lacks:
                diff.append(f'has {_join(lacks)}, which rank {rank} lacked')
            if extra:
                diff.append(f'lacks {_join(extra)}')
            lines.append(
                f'  rank {other} (its terms as of iteration '
                f'{terms.get("iter")}): ' +
                ('; '.join(diff) if diff else 'the same terms') + '.')
        if files:
            lines.append(f'Files of rank {rank}\'s batch: {_join(files, 8)}.')
        if kind == 'unused':
            what = (f'{_join(change["missing"] + change["detached"])} was '
                    'not computed' if change is not None and
                    (change['missing'] or change['detached']) else
                    'these modules were left out of the loss')
            lines.append('What to fix: ' + _FIX.format(
                what=what, rank=rank, it=it, files=''))
            if it is not None and it == watch.first_iter:
                lines.append(
                    'In the first iteration this usually means modules that '
                    'no loss uses at all (built but never called, or meant '
                    'to be frozen): set requires_grad=False on them or '
                    'remove them; if they are idle only in some iterations '
                    'by design, find_unused_parameters=True is the setting '
                    'for that.')
        else:
            lines.append('What to fix: ' + _TWICE_FIX.format(rank=rank))
        lines.append(f'PyTorch\'s message: {exc}')
        return dict(error=DDPParameterError('\n'.join(lines)),
                    cause=f'ddp_{kind}_parameters',
                    rank=rank, iter=it, loss_terms=watch.last_keys,
                    missing=change['missing'] if change else [],
                    detached=change['detached'] if change else [],
                    modules=modules, parameters=names,
                    other_ranks={str(k): v for k, v in others.items()},
                    files=files)

    def _other_ranks(self) -> Dict[int, Optional[Dict]]:
        if self._channel is None or not is_distributed():
            return {}
        rank = get_rank()
        return {r: self._channel.get_value(f'loss_terms/{r}', timeout=2.0)
                for r in range(get_world_size()) if r != rank}

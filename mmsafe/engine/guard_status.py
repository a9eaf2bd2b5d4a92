"""What each guard could check in a run: active, partial or inactive.

A guard whose reach depends on the model or the data (where the infrared
image is, which loss terms are pairing-sensitive, whether the pipeline
records each modality's geometry) says so through one method, as
:class:`~mmsafe.engine.run_context.FailureExplainer` does (no base class,
no guard class named here)::

    def guard_status(self, runner) -> dict:
        return dict(status='partial', detail='...',
                    checks={'pair geometry': dict(status='inactive',
                                                  detail='...')})

:func:`guard_statuses` asks the runner's hooks, its optim wrapper and the
runner itself; ``safety_report.json`` keeps the answers (``guards``). A
guard of mmsafe without the method needs nothing from the model or the
data: it is listed active.
"""
from collections import OrderedDict
from typing import Any, Dict, Optional

#: the statuses
ACTIVE, PARTIAL, INACTIVE = 'active', 'partial', 'inactive'
STATUSES = (ACTIVE, PARTIAL, INACTIVE)
#: the method a guard defines to tell its status
METHOD = 'guard_status'
#: what a guard without the method needs
MODEL_AGNOSTIC = 'needs nothing from the model or the data'


def status_of(checks: Dict[str, Dict[str, str]],
              detail: Optional[str] = None) -> Dict[str, Any]:
    """A guard's status from those of its checks: active when all are,
    inactive when none is, else partial.

    Args:
        checks (dict): check name -> ``dict(status=..., detail=...)``.
        detail (str, optional): a line about the guard as a whole.

    Returns:
        dict: ``status``, ``detail`` and ``checks``.
    """
    states = {c['status'] for c in checks.values()}
    if states <= {ACTIVE}:
        status = ACTIVE
    elif states <= {INACTIVE}:
        status = INACTIVE
    else:
        status = PARTIAL
    if detail is None:
        detail = '; '.join(f'{name}: {c["status"]}'
                           for name, c in checks.items())
    return dict(status=status, detail=detail, checks=checks)


def _declares_outputs(obj: Any) -> bool:
    from mmsafe.guard_outputs import outputs_of
    return outputs_of(obj) is not None


def _ask(obj: Any, runner) -> Optional[Dict[str, Any]]:
    method = getattr(obj, METHOD, None)
    if callable(method):
        return method(runner)
    if _declares_outputs(obj):
        return dict(status=ACTIVE, detail=MODEL_AGNOSTIC)
    return None


def guard_statuses(runner) -> Dict[str, Dict[str, Any]]:
    """Every guard of ``runner`` with its status, by class name: the
    runner (``SafeRunner`` or not), the optim wrapper (mmsafe's NaN-skip
    wrappers or not), then the hooks in their order.

    Args:
        runner: the runner of the run (any MMEngine runner).

    Returns:
        dict: name -> ``dict(status, detail[, checks])``.
    """
    from mmengine.optim import OptimWrapper
    from mmsafe.engine.optimizers import NaNSkipOptimWrapper
    out: 'OrderedDict[str, Dict[str, Any]]' = OrderedDict()
    name = type(runner).__name__
    out[name] = _ask(runner, runner) or dict(
        status=INACTIVE, detail=f"runner_type is {name}, not 'SafeRunner': "
        'no crash report, no rank-failure naming, no clean stop, no '
        "trusted checkpoint loading; set runner_type = 'SafeRunner'")
    wrapper = getattr(runner, 'optim_wrapper', None)
    if isinstance(wrapper, OptimWrapper):
        if isinstance(wrapper, NaNSkipOptimWrapper):
            out[type(wrapper).__name__] = _ask(wrapper, runner)
        else:
            out['NaN/Inf step skip'] = dict(
                status=INACTIVE, detail=f'the optim wrapper is '
                f'{type(wrapper).__name__}: a non-finite loss or gradient '
                "updates the weights; set optim_wrapper.type = "
                "'NaNSkipOptimWrapper' (or 'AmpNaNSkipOptimWrapper')")
    for hook in getattr(runner, 'hooks', []):
        if type(hook).__name__ == 'SafetyReportHook':
            continue
        entry = _ask(hook, runner)
        if entry is not None:
            out[type(hook).__name__] = entry
    return out


def summary_line(statuses: Dict[str, Dict[str, Any]],
                 limit: int = 4) -> str:
    """The guards in one line: counts, then the partial and inactive ones
    with their details (the first ``limit`` of each)."""
    counts = {s: [n for n, e in statuses.items() if e['status'] == s]
              for s in STATUSES}
    parts = [', '.join(f'{len(counts[s])} {s}' for s in STATUSES
                       if counts[s])]
    for state in (PARTIAL, INACTIVE):
        names = counts[state]
        if names:
            shown = '; '.join(f'{n} ({statuses[n]["detail"][:160]})'
                              for n in names[:limit])
            more = len(names) - limit
            parts.append(f'{state}: {shown}' + (f' and {more} more'
                                                 if more > 0 else ''))
    return ' | '.join(parts)

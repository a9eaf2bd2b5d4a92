"""Which mmsafe guards the config turns on, and which it leaves off."""
from typing import Any, Iterator, Set

from ..context import PreflightContext
from ..report import CheckRow

NAME = 'guards'
# mmdet registry names (Registry.name) whose mmsafe entries are guards
GUARD_REGISTRIES = ('hook', 'optim_wrapper')


def _types(node: Any) -> Set[str]:
    found: Set[str] = set()
    if isinstance(node, dict):
        if isinstance(node.get('type'), str):
            found.add(node['type'].split('.')[-1])
        for value in node.values():
            found |= _types(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            found |= _types(value)
    return found


def check_guards(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Summarise the mmsafe components of the config."""
    imports = (ctx.cfg.get('custom_imports', None) or {}).get('imports', [])
    imports = [imports] if isinstance(imports, str) else list(imports)
    if not any(m == 'mmsafe' or str(m).startswith('mmsafe.')
               for m in imports):
        yield CheckRow(
            'warn', NAME, 'The config does not import mmsafe: no mmsafe '
            'component or guard is registered for this run.',
            'custom_imports', "Add custom_imports=dict(imports=['mmsafe'], "
            'allow_failed_imports=False).')
        return
    try:
        from mmsafe.registry_help import mmsafe_registered_names
        registered = mmsafe_registered_names()
    except Exception:  # pragma: no cover - mmsafe import errors show earlier
        registered = {}
    used = _types({k: ctx.cfg[k] for k in ctx.cfg.keys()})
    all_mmsafe = {n for names in registered.values() for n in names}
    guards = {n for r in GUARD_REGISTRIES for n in registered.get(r, [])}
    on = sorted(used & guards)
    parts = sorted((used & all_mmsafe) - guards)
    off = sorted(guards - used)
    yield CheckRow(
        'info', NAME, 'mmsafe guards on: ' + (', '.join(on) if on else
                                              'none') + '.',
        'custom_hooks / optim_wrapper.type',
        '' if on else "Add guards to custom_hooks (e.g. dict(type="
        "'DataLoaderProbeHook')) and optim_wrapper.type="
        "'NaNSkipOptimWrapper'.")
    if parts:
        yield CheckRow('ok', NAME, 'Other mmsafe components in use: ' +
                       ', '.join(parts) + '.', 'model / *_dataloader')
    if off:
        yield CheckRow(
            'info', NAME, 'mmsafe guards available but off: ' +
            ', '.join(off) + '.', 'custom_hooks / optim_wrapper.type',
            'Add hooks to custom_hooks, or set optim_wrapper.type, to turn '
            'them on.')

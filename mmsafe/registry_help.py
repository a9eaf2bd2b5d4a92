"""Clearer errors for unknown type names in a config.

MMEngine raises ``KeyError: 'Foo is not in the mmdet::model registry'``.
When that happens we re-raise the same error with the mmsafe names of that
registry and the closest matches, so a typo such as ``DualStreamFasterRCN``
points at the right name.
"""
import difflib
from typing import Dict, List

from mmengine.registry import Registry

_MARKER = 'mmsafe registers in'


def mmsafe_registered_names() -> Dict[str, List[str]]:
    """Return ``{registry name: [mmsafe type names]}`` for mmdet registries."""
    from mmdet import registry as mmdet_registry
    found: Dict[str, List[str]] = {}
    for attr in dir(mmdet_registry):
        reg = getattr(mmdet_registry, attr)
        if not isinstance(reg, Registry):
            continue
        names = sorted(
            name for name, obj in reg.module_dict.items()
            if getattr(obj, '__module__', '').startswith('mmsafe'))
        if names:
            found.setdefault(reg.name, [])
            found[reg.name] = sorted(set(found[reg.name]) | set(names))
    return found


def _augment(registry: Registry, missing: str, message: str) -> str:
    names = mmsafe_registered_names()
    all_names = sorted({n for group in names.values() for n in group})
    here = names.get(registry.name, [])
    close = difflib.get_close_matches(missing, all_names, n=3, cutoff=0.6)
    extra = [message]
    if close:
        extra.append(f'Did you mean: {", ".join(close)}?')
    extra.append(f'{_MARKER} the {registry.name} registry: '
                 f'{", ".join(here) if here else "(none)"}. '
                 f'All mmsafe names: {", ".join(all_names)}.')
    return ' '.join(extra)


def _install() -> None:
    if getattr(Registry.build, '_mmsafe_patched', False):
        return
    original = Registry.build

    def build(self, cfg, *args, **kwargs):
        try:
            return original(self, cfg, *args, **kwargs)
        except KeyError as err:
            message = str(err.args[0]) if err.args else ''
            if 'registry' not in message or _MARKER in message:
                raise
            missing = cfg.get('type') if hasattr(cfg, 'get') else None
            if not isinstance(missing, str):
                raise
            raise KeyError(_augment(self, missing, message)) from err

    build._mmsafe_patched = True
    Registry.build = build


_install()

"""mmsafe's names in MMDetection's registries, and clearer errors for
unknown type names in a config.

MMEngine raises ``KeyError: 'Foo is not in the mmdet::model registry'``.
:func:`explain_unknown_type` turns it into the same error plus the mmsafe
names of that registry and the closest matches, so a typo such as
``DualStreamFasterRCN`` points at the right name.
"""
import difflib
import re
from typing import Dict, List, Optional

from mmengine.registry import Registry

from mmsafe.errors import MMSafeKeyError

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


_MISSING = re.compile(r"`?(\w+)`? is not in the (\S+) registry")


def explain_unknown_type(error: KeyError) -> Optional[KeyError]:
    """A clearer KeyError for MMEngine's "X is not in the mmdet::model
    registry", or None when ``error`` is not that error.

    The new message keeps MMEngine's and adds the closest mmsafe names
    (``Did you mean: ...?``) and every name mmsafe registers there. The
    tools (``tools/train.py``, ``tools/test.py``) raise it from the
    original error.
    """
    message = str(error.args[0]) if error.args else ''
    match = _MISSING.search(message)
    if match is None or _MARKER in message:
        return None
    missing, registry = match.group(1), match.group(2).split('::')[-1]
    names = mmsafe_registered_names()
    all_names = sorted({n for group in names.values() for n in group})
    here = names.get(registry, [])
    close = difflib.get_close_matches(missing, all_names, n=3, cutoff=0.6)
    extra = [message]
    if close:
        extra.append(f'Did you mean: {", ".join(close)}?')
    extra.append(f'{_MARKER} the {registry} registry: '
                 f'{", ".join(here) if here else "(none)"}. '
                 f'All mmsafe names: {", ".join(all_names)}.')
    return MMSafeKeyError(' '.join(extra))

"""mmsafe's type names, the one line that says which of them a project
holds, and clearer errors for unknown type names in a config.

MMEngine raises ``KeyError: 'Foo is not in the mmdet::model registry'``.
:func:`explain_unknown_type` turns it into the same error plus the closest
mmsafe names and how to reach them, so a typo such as
``DualStreamFasterRCN`` points at the right name, and ``LLVIPDataset``
under ``default_scope = 'mmdet'`` points at ``mmsafe.LLVIPDataset``.
"""
import difflib
import logging
import re
from typing import Dict, List, Optional

from mmsafe.errors import MMSafeKeyError

_MARKER = 'mmsafe registers in'
#: the names :func:`announce_scope` has already reported, by registry
_ANNOUNCED: Dict[str, set] = {}


def mmsafe_registered_names() -> Dict[str, List[str]]:
    """Return ``{registry name: [type names]}`` of mmsafe's scope
    (``'dataset'``, ``'model'``, ``'hook'`` ...)."""
    from mmsafe.registry import MACHINERY, STACK
    found: Dict[str, List[str]] = {}
    for ours, _ in MACHINERY + STACK:
        names = sorted(ours.module_dict)
        if names:
            found[ours.name] = sorted(set(found.get(ours.name, [])) |
                                      set(names))
    return found


def announce_scope() -> Dict[str, list]:
    """Publish mmsafe's machinery names to MMDetection's scope
    (:func:`mmsafe.registry.publish_machinery`) and log, once per name and
    on rank 0 of the main process, which of mmsafe's names a project holds
    there (:func:`mmsafe.registry.names_left_to_project`).

    mmsafe's import calls it; :class:`~mmsafe.engine.runner.SafeRunner`
    calls it again when it is built, for a project registered after mmsafe.

    Returns:
        dict: ``{registry name: [(name, module)]}``, every name left to a
        project now (reported or not).
    """
    from mmsafe.registry import (is_main_process_rank0,
                                 names_left_to_project, publish_machinery,
                                 scope_summary)
    publish_machinery()
    left = names_left_to_project()
    new = {
        reg: [(name, module) for name, module in entries
              if name not in _ANNOUNCED.get(reg, set())]
        for reg, entries in left.items()
    }
    new = {reg: entries for reg, entries in new.items() if entries}
    if new and is_main_process_rank0():
        from mmengine.logging import print_log
        print_log(scope_summary(new), logger='current',
                  level=logging.INFO)
    for reg, entries in new.items():
        _ANNOUNCED.setdefault(reg, set()).update(name for name, _ in entries)
    return left


_MISSING = re.compile(r"`?([\w.]+)`? is not in the (\S+) registry")


def explain_unknown_type(error: KeyError) -> Optional[KeyError]:
    """A clearer KeyError for MMEngine's "X is not in the mmdet::model
    registry", or None when ``error`` is not that error.

    The new message keeps MMEngine's and adds, when mmsafe has ``X`` in its
    own scope, how to reach it (``mmsafe.X``, ``_scope_='mmsafe'`` or
    ``default_scope='mmsafe'``); else the closest mmsafe names (``Did you
    mean: ...?``) and every name mmsafe registers there. The tools
    (``tools/train.py``, ``tools/test.py``) raise it from the original
    error.
    """
    message = str(error.args[0]) if error.args else ''
    match = _MISSING.search(message)
    if match is None or _MARKER in message:
        return None
    missing, registry = match.group(1), match.group(2).split('::')[-1]
    bare = missing.split('.')[-1]
    names = mmsafe_registered_names()
    all_names = sorted({n for group in names.values() for n in group})
    here = names.get(registry, [])
    extra = [message]
    if bare in here and missing == bare:
        extra.append(
            f'mmsafe\'s {bare} is in the mmsafe scope: write '
            f'type=\'mmsafe.{bare}\', or add _scope_=\'mmsafe\' to that '
            'dict (its parts then build in that scope too), or set '
            'default_scope = \'mmsafe\' in the config.')
    else:
        close = difflib.get_close_matches(bare, all_names, n=3, cutoff=0.6)
        if close:
            extra.append(f'Did you mean: {", ".join(close)}?')
    extra.append(f'{_MARKER} the {registry} registry: '
                 f'{", ".join(here) if here else "(none)"}. '
                 f'All mmsafe names: {", ".join(all_names)}.')
    return MMSafeKeyError(' '.join(extra))

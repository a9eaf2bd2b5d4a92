"""Recognise PyTorch's DDP errors about parameters and name the
parameters they mean.

DDP reports a parameter that got no gradient on a rank (or one that got
two) by its index in the reducer's parameter list: "Parameter indices which
did not receive grad for rank 1: 6 7 8 ...", "Parameter at index 12 ... has
been marked as ready twice". The names appear only with
``TORCH_DISTRIBUTED_DEBUG=DETAIL``. The reducer's list is built by one rule
on every supported torch: the wrapped module's ``named_modules()``, each
module's own parameters that require grad and are not in
``parameters_to_ignore``, the first occurrence of a shared parameter only.
"""
import re
from typing import List, Optional

import torch.nn as nn

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
    """Names of ``module``'s parameters in DDP's reducer order (see the
    module docstring); ``ignore``: DDP's ``parameters_to_ignore``."""
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

"""Every pretrained weight source of the model is reachable offline.

Sources: ``init_cfg=dict(type='Pretrained', checkpoint=...)`` anywhere in the
model, a backbone's ``pretrained=...`` and (through
:func:`remote_source_rows`, used by the checkpoint check) a ``load_from``
given as a URL or model-zoo name. For each one:

* a local path must exist;
* ``torchvision://``, ``open-mmlab://``, ``mmcls://`` names and http(s) URLs
  must be in the torch hub cache (``torch.hub.get_dir()/checkpoints/
  <basename>``, where MMEngine's download puts them and where mmsafe's
  loader looks first). If not, the URL is probed with a short HEAD request:
  reachable is a warning (downloaded at start-up), unreachable an error
  naming the file to place where and the ``--cfg-options`` lines that
  replace or drop the source.
"""
import os.path as osp
import urllib.request
from typing import Any, Dict, Iterator, Optional, Tuple

from ..context import PreflightContext, first_line
from ..report import CheckRow

NAME = 'checkpoint'
#: seconds a preflight reachability probe may take
PROBE_TIMEOUT = 5.0
ZOO_SCHEMES = ('torchvision://', 'modelzoo://', 'open-mmlab://',
               'openmmlab://', 'mmcls://')
URL_SCHEMES = ('http://', 'https://')


def is_remote(name: str) -> bool:
    """True for http(s) URLs and model-zoo names."""
    return name.startswith(URL_SCHEMES + ZOO_SCHEMES)


def _probe(url: str, timeout: float = PROBE_TIMEOUT) -> Optional[str]:
    """None when ``url`` answers a HEAD request, else why not."""
    try:
        request = urllib.request.Request(
            url, method='HEAD', headers={'User-Agent': 'mmsafe'})
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except Exception as err:  # reported as the row's reason
        return f'{type(err).__name__}: {first_line(err, 200)}'


def _fix_lines(where: str, basename: str) -> str:
    if where.endswith('.init_cfg.checkpoint'):
        drop = where[:-len('.checkpoint')]
    else:
        drop = where
    return (f'--cfg-options {where}=/path/to/{basename} (a local copy), or '
            f'--cfg-options {drop}=None (random initial weights)')


def remote_source_rows(name: str, where: str,
                       probes: Optional[Dict[str, Optional[str]]] = None
                       ) -> Iterator[CheckRow]:
    """Rows for one URL or model-zoo name ``name`` used at ``where``.

    Args:
        name (str): e.g. ``'torchvision://resnet50'`` or an https URL.
        where (str): the config key path that holds it.
        probes (dict, optional): reachability per URL, shared between the
            sources of one run so each URL is probed once.
    """
    from mmsafe.checkpoint.remote_weights import cache_path, resolve_url
    try:
        url = resolve_url(name)
    except ImportError as err:
        yield CheckRow(
            'error', NAME, f'{name} needs torchvision to resolve, and it '
            f'does not import ({first_line(err)}): the model cannot '
            'initialise.', where, 'pip install the torchvision matching your '
            f'torch, or {_fix_lines(where, "weights.pth")}.')
        return
    except KeyError as err:
        yield CheckRow('error', NAME, f'{first_line(err)}.', where,
                       'Use a name the zoo knows, a URL or a local path.')
        return
    if not url.startswith(URL_SCHEMES):  # an open-mmlab:// local entry
        from mmengine.runner.checkpoint import _get_mmengine_home
        path = osp.join(_get_mmengine_home(), url)
        yield from local_source_rows(path, where, label=name)
        return
    cached = cache_path(url)
    label = name if name == url else f'{name} ({url})'
    if osp.isfile(cached):
        size = osp.getsize(cached) / 2**20
        yield CheckRow('ok', NAME, f'{label} is cached at {cached} '
                       f'({size:.0f} MiB): no download needed.', where)
        return
    probes = {} if probes is None else probes
    if url not in probes:
        probes[url] = _probe(url)
    reason = probes[url]
    basename = osp.basename(cached)
    if reason is None:
        yield CheckRow(
            'warn', NAME, f'{label} is not in the torch hub cache ({cached}):'
            ' it is downloaded when training starts (reachable now).', where,
            f'On a machine without network, place the file at {cached}; or '
            f'{_fix_lines(where, basename)}.')
        return
    yield CheckRow(
        'error', NAME, f'{label} is not in the torch hub cache ({cached}) and '
        f'cannot be downloaded from here ({reason}): the model cannot '
        'initialise.', where,
        f'Place the file at {cached} (download {url} on a machine with '
        'network; TORCH_HOME moves the cache), or '
        f'{_fix_lines(where, basename)}.')


def local_source_rows(path: str, where: str,
                      label: Optional[str] = None) -> Iterator[CheckRow]:
    """Rows for a pretrained weight file given as a local path."""
    label = label or path
    if osp.isfile(path):
        size = osp.getsize(path) / 2**20
        yield CheckRow('ok', NAME, f'Pretrained weights {label} exist '
                       f'({size:.0f} MiB).', where)
        return
    yield CheckRow(
        'error', NAME, f'Pretrained checkpoint {label!r} does not exist '
        f'(absolute: {osp.abspath(path)}).', where,
        f'Place the file there, or {_fix_lines(where, osp.basename(path))}.')


def pretrained_sources(node: Any, path: str = 'model'
                       ) -> Iterator[Tuple[str, str]]:
    """``(config key path, source)`` of every pretrained weight of a model
    config: ``Pretrained`` init_cfgs and ``pretrained='...'`` keys."""
    if isinstance(node, dict):
        if node.get('type') == 'Pretrained' and isinstance(
                node.get('checkpoint'), str):
            yield f'{path}.checkpoint', node['checkpoint']
        if isinstance(node.get('pretrained'), str):
            yield f'{path}.pretrained', node['pretrained']
        for key, value in node.items():
            yield from pretrained_sources(value, f'{path}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from pretrained_sources(value, f'{path}[{i}]')


def check_pretrained_weights(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Rows for every pretrained source of ``ctx.cfg.model``."""
    probes: Dict[str, Optional[str]] = ctx.state.setdefault(
        'weight_probes', {})
    for where, source in pretrained_sources(ctx.cfg.get('model', None)):
        if is_remote(source):
            yield from remote_source_rows(source, where, probes)
        elif '://' in source:
            yield CheckRow('info', NAME, f'{source}: remote storage, not '
                           'checked.', where)
        else:
            yield from local_source_rows(source, where)

"""Pretrained weights by URL: the torch hub cache first, then a download
with a deadline, and one clear error when neither works.

MMEngine downloads ``http(s)://``, ``torchvision://`` and ``open-mmlab://``
weights (``init_cfg=dict(type='Pretrained', checkpoint=...)``, ``load_from``)
with ``torch.hub.load_state_dict_from_url``: no timeout, so an offline node
either hangs on the connection or dies in the model's init with a raw
``urllib`` traceback. mmsafe's loader of these schemes
(:func:`~.schemes.load_from_url_or_cache`) finds the file here:

* :func:`weights_location`: the https URL behind a model-zoo name (or the
  file under MMEngine's home that an ``open-mmlab://`` entry names);
* :func:`ensure_cached`: the file from
  ``torch.hub.get_dir()/checkpoints/<basename>`` when it is there (the
  place MMEngine's own download puts it), without network; otherwise
  downloaded there (a temporary file renamed when complete) with a socket
  timeout of ``MMSAFE_DOWNLOAD_TIMEOUT`` seconds (default 15);
* on failure :class:`WeightsUnavailableError` naming the URL, the cache
  path and the fixes, chained to the original error.

Under ``torch.distributed`` the first rank of each node downloads while the
others wait in one small collective that tells every rank every rank's
outcome, so all ranks raise together and none waits forever.
"""
import os
import os.path as osp
import shutil
import tempfile
import urllib.request
from typing import List, Optional
from urllib.parse import urlparse

import torch

from mmsafe.errors import MMSafeError, MMSafeKeyError, MMSafeValueError

#: environment variable: socket timeout of a weight download, in seconds
TIMEOUT_ENV = 'MMSAFE_DOWNLOAD_TIMEOUT'
DEFAULT_TIMEOUT = 15.0


class WeightsUnavailableError(MMSafeError, RuntimeError):
    """A pretrained weight file is neither cached nor downloadable."""


def download_timeout() -> float:
    """The socket timeout of weight downloads (``MMSAFE_DOWNLOAD_TIMEOUT``)."""
    value = os.environ.get(TIMEOUT_ENV, '')
    try:
        return float(value) if value else DEFAULT_TIMEOUT
    except ValueError as err:
        raise MMSafeValueError(f'{TIMEOUT_ENV}={value!r} is not a number of '
                               'seconds') from err


def hub_checkpoint_dir() -> str:
    """``torch.hub.get_dir()/checkpoints``: where downloaded weights live."""
    return osp.join(torch.hub.get_dir(), 'checkpoints')


def cache_path(url: str) -> str:
    """Where the torch hub cache keeps the file of ``url``."""
    return osp.join(hub_checkpoint_dir(),
                    osp.basename(urlparse(url).path) or 'download.pth')


def resolve_url(name: str) -> str:
    """The https URL behind ``torchvision://``, ``modelzoo://``,
    ``open-mmlab://``/``openmmlab://`` and ``mmcls://`` names; an http(s)
    URL is returned as it is.

    Raises:
        KeyError: the name is not in the scheme's model list.
        ImportError: ``torchvision://`` without torchvision installed.
    """
    from mmengine.runner import checkpoint as mm_ckpt
    if name.startswith(('http://', 'https://')):
        return name
    if name.startswith(('torchvision://', 'modelzoo://')):
        models = mm_ckpt.get_torchvision_models()
        key = name.split('://', 1)[1]
    elif name.startswith(('open-mmlab://', 'openmmlab://')):
        models = mm_ckpt.get_external_models()
        key = name.split('://', 1)[1]
        key = mm_ckpt.get_deprecated_model_names().get(key, key)
    elif name.startswith('mmcls://'):
        models = mm_ckpt.get_mmcls_models()
        key = name.split('://', 1)[1]
    else:
        raise MMSafeKeyError(f'{name}: not a URL or model-zoo name')
    if key not in models:
        raise MMSafeKeyError(f'{name}: no model named {key!r} in that zoo')
    return models[key]


def fix_hint(url: str, cached: str) -> str:
    """How to make ``url`` available offline (shared with preflight)."""
    return (f'download {url} on a machine with network and copy it to '
            f'{cached} (torch.hub.get_dir()/checkpoints; TORCH_HOME moves '
            'it), or point the config at a local copy of the file '
            "(e.g. --cfg-options model.backbone.init_cfg.checkpoint="
            "/path/to/file.pth), or train from random weights "
            '(--cfg-options model.backbone.init_cfg=None); '
            'tools/preflight.py CONFIG names every config key that uses it')


def _download(url: str, dest: str, timeout: float) -> None:
    """Download ``url`` to ``dest`` (temporary file, then rename)."""
    os.makedirs(osp.dirname(dest), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.mmsafe-', suffix='.part',
                               dir=osp.dirname(dest))
    try:
        request = urllib.request.Request(
            url, headers={'User-Agent': 'mmsafe'})
        with os.fdopen(fd, 'wb') as out, urllib.request.urlopen(
                request, timeout=timeout) as response:
            shutil.copyfileobj(response, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)


def _fetch(url: str, cached: str) -> Optional[BaseException]:
    """Make sure ``cached`` exists; the download error, if any."""
    if osp.isfile(cached):
        return None
    try:
        _download(url, cached, download_timeout())
    except Exception as err:  # returned, agreed on and re-raised by caller
        return err
    return None


def _local_leader() -> bool:
    local_rank = os.environ.get('LOCAL_RANK')
    if local_rank is not None and local_rank.isdigit():
        return int(local_rank) == 0
    return torch.distributed.get_rank() == 0


def ensure_cached(url: str, name: Optional[str] = None) -> str:
    """The local cache path of ``url``, downloading it if needed.

    Args:
        url (str): an http(s) URL.
        name (str, optional): the name the config used (e.g.
            ``torchvision://resnet50``), for the error message.

    Raises:
        WeightsUnavailableError: neither cached nor downloadable; chained to
            the download error.
    """
    cached = cache_path(url)
    dist = (torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1)
    error: Optional[BaseException] = None
    if not dist:
        error = _fetch(url, cached)
    else:
        # The first rank of each node downloads while the others wait in
        # the collective; then every rank knows every rank's outcome.
        if _local_leader():
            error = _fetch(url, cached)
        outcome = None if error is None else f'{type(error).__name__}: ' \
            f'{error}'
        everyone: List[Optional[str]] = [None] * \
            torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, outcome)
        failed = [(rank, text) for rank, text in enumerate(everyone) if text]
        if failed and error is None:
            error = RuntimeError(f'the download failed on rank '
                                 f'{failed[0][0]}: {failed[0][1]}')
        elif not failed and not osp.isfile(cached):
            error = _fetch(url, cached)  # the leader's cache is not shared
    if error is not None:
        label = f'{name} ({url})' if name and name != url else url
        raise WeightsUnavailableError(
            f'[mmsafe] pretrained weights {label} are not available: they '
            f'are not in the torch hub cache ({cached}) and the download '
            f'failed: {type(error).__name__}: {error} (timeout '
            f'{download_timeout():g} s, {TIMEOUT_ENV}). Fix: '
            f'{fix_hint(url, cached)}.') from error
    return cached


def weights_location(filename: str) -> str:
    """Where the weights that ``filename`` (a URL or model-zoo name) names
    are: an http(s) URL, or the path of a file under MMEngine's home (an
    ``open-mmlab://`` entry may name one).

    Raises:
        WeightsUnavailableError: the name does not resolve.
    """
    try:
        url = resolve_url(filename)
    except (ImportError, KeyError) as err:
        raise WeightsUnavailableError(
            f'[mmsafe] cannot resolve the pretrained weights {filename}: '
            f'{type(err).__name__}: {err}. Fix: give the https URL or a '
            'local path of the file in the config instead.') from err
    if url.startswith(('http://', 'https://')):
        return url
    from mmengine.runner import checkpoint as mm_ckpt
    return osp.join(mm_ckpt._get_mmengine_home(), url)

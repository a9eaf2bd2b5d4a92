"""mmsafe's loader behind every ``CheckpointLoader`` scheme of MMEngine.

MMEngine's ``CheckpointLoader`` picks a loader by the path's prefix; each
of its own loaders ends in a plain ``torch.load`` (unrestricted before
torch 2.6). :func:`register_checkpoint_schemes` registers, through
MMEngine's extension point (``CheckpointLoader.register_scheme(...,
force=True)``), loaders that fetch the file the way MMEngine does and load
it with :func:`~.loader.load_checkpoint_file`:

=====================================  ===================================
prefix                                 file from
=====================================  ===================================
local paths (``''``)                   the path
``http(s)://``, ``torchvision://``,    the torch hub cache, else a download
``modelzoo://``, ``open-mmlab://``,    with a deadline
``openmmlab://``, ``mmcls://``         (:mod:`.remote_weights`)
``s3://``, ``petrel://`` (also         MMEngine's file backend (petrel)
``<cluster>:s3://``)
``pavi://``                            pavi's model cloud (needs ``pavi``)
=====================================  ===================================

:class:`~mmsafe.engine.runner.SafeRunner` calls it when it is built; it is
idempotent. A scheme that another package registers later loads as that
package defines.
"""
import io
import os.path as osp
import tempfile
from typing import Any

from mmsafe.errors import MMSafeImportError, MMSafeValueError
from .loader import load_checkpoint_file, load_from_local
from .remote_weights import ensure_cached, weights_location

#: the schemes whose files come from the torch hub cache
SCHEMES = ('http://', 'https://', 'torchvision://', 'modelzoo://',
           'open-mmlab://', 'openmmlab://', 'mmcls://')
#: MMEngine's prefixes of its object-storage schemes
CEPH_PREFIXES = (r'(\S+\:)?s3://', r'(\S+\:)?petrel://')


def load_from_url_or_cache(filename: str, map_location: Any = None) -> Any:
    """CheckpointLoader scheme for http(s) URLs and model-zoo names: the
    file from the torch hub cache, else downloaded with a deadline
    (:mod:`.remote_weights`), loaded with :func:`load_checkpoint_file`.

    Raises:
        WeightsUnavailableError: neither cached nor downloadable.
    """
    location = weights_location(filename)
    if not location.startswith(('http://', 'https://')):
        return load_from_local(location, map_location)
    checkpoint = load_checkpoint_file(ensure_cached(location, name=filename),
                                      map_location)
    if filename.startswith('mmcls://'):
        from mmengine.runner.checkpoint import _process_mmcls_checkpoint
        checkpoint = _process_mmcls_checkpoint(checkpoint)
    return checkpoint


def load_from_ceph(filename: str, map_location: Any = None,
                   backend: str = 'petrel') -> Any:
    """MMEngine's ``load_from_ceph``: the bytes from the file backend
    ``backend``, loaded with :func:`load_checkpoint_file`."""
    from mmengine.fileio import get_file_backend
    file_backend = get_file_backend(filename,
                                    backend_args={'backend': backend})
    with io.BytesIO(file_backend.get(filename)) as buffer:
        return load_checkpoint_file(buffer, map_location)


def load_from_pavi(filename: str, map_location: Any = None) -> Any:
    """MMEngine's ``load_from_pavi``: downloaded from pavi's model cloud
    into a temporary folder, loaded with :func:`load_checkpoint_file`."""
    if not filename.startswith('pavi://'):
        raise MMSafeValueError(f'expected a pavi:// path, got {filename}')
    try:
        from pavi import modelcloud
    except ImportError as err:
        raise MMSafeImportError('Please install pavi to load checkpoint from '
                                'modelcloud.') from err
    model = modelcloud.get(filename[len('pavi://'):])
    with tempfile.TemporaryDirectory() as tmp_dir:
        downloaded = osp.join(tmp_dir, osp.basename(model.name))
        model.download(downloaded)
        return load_checkpoint_file(downloaded, map_location)


def register_local_weights_only_scheme() -> None:
    """Register :func:`~.loader.load_from_local` for local paths (the
    empty prefix). Idempotent."""
    from mmengine.runner import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local,
                                     force=True)


def register_remote_weight_schemes() -> None:
    """Register :func:`load_from_url_or_cache` for :data:`SCHEMES`.
    Idempotent."""
    from mmengine.runner import CheckpointLoader
    CheckpointLoader.register_scheme(
        prefixes=list(SCHEMES), loader=load_from_url_or_cache, force=True)


def register_checkpoint_schemes() -> None:
    """Register mmsafe's loading for every scheme of MMEngine's
    ``CheckpointLoader`` (see the module docstring). Idempotent."""
    from mmengine.runner import CheckpointLoader
    register_local_weights_only_scheme()
    register_remote_weight_schemes()
    CheckpointLoader.register_scheme(prefixes=list(CEPH_PREFIXES),
                                     loader=load_from_ceph, force=True)
    CheckpointLoader.register_scheme(prefixes='pavi://',
                                     loader=load_from_pavi, force=True)

"""Every scheme of MMEngine's CheckpointLoader loads through mmsafe's
loader once SafeRunner registered them: local paths, URLs and model zoo
names, object storage (s3/petrel), pavi."""
import io
import os.path as osp
import types

import pytest
import torch
from mmengine.fileio import BaseStorageBackend, register_backend
from mmengine.runner import CheckpointLoader

import mmsafe  # noqa: F401
from mmsafe.checkpoint import (CheckpointFormatError,
                               UntrustedCheckpointError,
                               register_checkpoint_schemes)
from mmsafe.checkpoint.schemes import load_from_ceph, load_from_pavi
from tests.checkpoint import payloads as p

_MEMORY = {}


@register_backend('mmsafe_test_memory', force=True)
class _MemoryBackend(BaseStorageBackend):
    """Object storage kept in a dict (what petrel gives MMEngine)."""

    def get(self, filepath):
        return _MEMORY[str(filepath)]

    def get_text(self, filepath, encoding='utf-8'):
        return _MEMORY[str(filepath)].decode(encoding)


def _bytes(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize('path', [
    '/data/x.pth', 'x.pth', 'http://h/x.pth', 'https://h/x.pth',
    'torchvision://resnet50', 'modelzoo://resnet50',
    'open-mmlab://resnet50_caffe', 'openmmlab://resnet50_caffe',
    'mmcls://resnet50', 's3://bucket/x.pth', 'cluster1:s3://bucket/x.pth',
    'petrel://bucket/x.pth', 'pavi://model/x.pth'])
def test_every_scheme_loads_through_mmsafe(path):
    register_checkpoint_schemes()
    loader = CheckpointLoader._get_checkpoint_loader(path)
    assert loader.__module__.startswith('mmsafe.checkpoint.'), (path, loader)


def test_no_mmengine_loader_is_left():
    """MMEngine's own schemes (each ends in a plain torch.load) are all
    replaced, whatever MMEngine registers."""
    register_checkpoint_schemes()
    left = {prefix: f'{loader.__module__}.{loader.__name__}'
            for prefix, loader in CheckpointLoader._schemes.items()
            if loader.__module__.startswith('mmengine.')}
    assert not left, left


def test_object_storage_bytes_are_loaded_by_mmsafe(tmp_path):
    _MEMORY['s3://bucket/good.pth'] = _bytes(dict(w=torch.arange(3.)))
    loaded = load_from_ceph('s3://bucket/good.pth', 'cpu',
                            backend='mmsafe_test_memory')
    assert torch.equal(loaded['w'], torch.arange(3.))
    bad = p.write_zip(str(tmp_path / 'bad.pth'), p.in_dict(
        ('x', p.call('argparse', 'Namespace'))))
    _MEMORY['s3://bucket/bad.pth'] = open(bad, 'rb').read()
    with pytest.raises(UntrustedCheckpointError, match='argparse'):
        load_from_ceph('s3://bucket/bad.pth', backend='mmsafe_test_memory')


def test_pavi_downloads_are_loaded_by_mmsafe(tmp_path, monkeypatch):
    files = {'good': _bytes(dict(w=torch.ones(2))), 'legacy': None}
    legacy = io.BytesIO()
    torch.save(dict(w=torch.ones(2)), legacy,
               _use_new_zipfile_serialization=False)
    files['legacy'] = legacy.getvalue()

    class Model:

        def __init__(self, name):
            self.name = name + '.pth'

        def download(self, path):
            with open(path, 'wb') as f:
                f.write(files[osp.splitext(self.name)[0]])

    modelcloud = types.SimpleNamespace(get=Model)
    monkeypatch.setitem(__import__('sys').modules, 'pavi',
                        types.SimpleNamespace(modelcloud=modelcloud))
    assert torch.equal(load_from_pavi('pavi://good')['w'], torch.ones(2))
    with pytest.raises(CheckpointFormatError, match='legacy'):
        load_from_pavi('pavi://legacy')
    with pytest.raises(ValueError, match='pavi://'):
        load_from_pavi('s3://x')


def test_pavi_without_pavi_says_so(monkeypatch):
    monkeypatch.setitem(__import__('sys').modules, 'pavi', None)
    with pytest.raises(ImportError, match='install pavi'):
        load_from_pavi('pavi://x')

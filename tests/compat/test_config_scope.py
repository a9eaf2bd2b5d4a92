"""``mmsafe::`` config paths and the ``mmsafe`` registry scope.

MMEngine 0.10 resolves ``pkg::path`` only for the packages of its own table;
mmsafe's tools add ``mmsafe`` to it. The first test fails when MMEngine
changes that (the shim in mmsafe/compat/config_scope.py is then to be
revisited). The wheel's end-to-end use is tests/test_install.py.
"""
import os.path as osp

import pytest
from mmengine.config import utils as config_utils
from mmengine.registry import HOOKS, MODELS

from mmsafe.compat.config_scope import SCOPE, register_config_scope
from mmsafe.tools import CONFIG_DIR, scoped_config_path
from tests.utils import REPO_ROOT


def test_mmengine_resolves_the_scope_only_once_registered(monkeypatch):
    monkeypatch.delitem(config_utils.MODULE2PACKAGE, SCOPE, raising=False)
    with pytest.raises(AssertionError, match='does not support to load'):
        config_utils._get_package_and_cfg_path('mmsafe::_base_/x.py')
    register_config_scope()
    register_config_scope()  # idempotent
    assert config_utils._get_package_and_cfg_path(
        'mmsafe::_base_/safety_runtime.py') == ('mmsafe',
                                                '_base_/safety_runtime.py')
    assert config_utils.MODULE2PACKAGE[SCOPE] == 'mmsafe'


def test_a_command_line_config_by_scope_is_this_mmsafes():
    path = scoped_config_path('mmsafe::llvip/demo_cpu.py')
    assert path == osp.join(CONFIG_DIR, 'llvip', 'demo_cpu.py')
    # the same file as the clone's configs/ (linked or copied there)
    with open(path, 'rb') as f, open(osp.join(
            REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py'), 'rb') as g:
        assert f.read() == g.read()
    assert scoped_config_path('configs/llvip/demo_cpu.py') == \
        'configs/llvip/demo_cpu.py'
    with pytest.raises(FileNotFoundError, match="no such config in .*"
                       r"\.mim.configs.*mmsafe::llvip/demo_cpu\.py"):
        scoped_config_path('mmsafe::llvip/no_such_config.py')


def test_the_mmsafe_scope_builds_mmsafe_mmdet_and_mmengine_types():
    import mmsafe  # noqa: F401
    from mmsafe.engine.hooks import DataLoaderProbeHook
    from mmengine.hooks import CheckpointHook
    # what MMEngine does for dict(type=..., _scope_='mmsafe'): the
    # registry of scope 'mmsafe' (imported from mmsafe.registry) builds it
    hook = HOOKS.build(dict(type='DataLoaderProbeHook', _scope_='mmsafe'))
    assert isinstance(hook, DataLoaderProbeHook)
    assert isinstance(
        HOOKS.build(dict(type='CheckpointHook', _scope_='mmsafe')),
        CheckpointHook)
    from mmsafe import registry
    with MODELS.switch_scope_and_registry('mmsafe') as models:
        assert models is registry.MODELS
        assert models.get('DualStreamFasterRCNN').__module__.startswith(
            'mmsafe.')
        assert models.get('FasterRCNN').__module__.startswith('mmdet.')
    with pytest.raises(KeyError, match='NoSuchHook'):
        HOOKS.build(dict(type='NoSuchHook', _scope_='mmsafe'))

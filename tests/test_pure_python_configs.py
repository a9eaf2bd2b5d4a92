"""mmsafe's pure-Python configs (``mmsafe/configs/``, MMEngine >= 0.8)
say what their text twins under ``configs/`` say: the same run, field by
field, with classes where the text has type names."""
import inspect
import os.path as osp

import pytest

from tests.utils import REPO_ROOT

read_base = pytest.importorskip(
    'mmengine.config', reason='MMEngine < 0.8 has no pure-Python configs'
).__dict__.get('read_base')
pytestmark = pytest.mark.skipif(
    read_base is None,
    reason='this MMEngine has no pure-Python configs (read_base: 0.8+)')

#: pure-Python config -> its text twin
TWINS = {
    'mmsafe/configs/_base_/safety_runtime.py':
        'configs/_base_/safety_runtime.py',
    'mmsafe/configs/_base_/models/dual_faster_rcnn_r50_fpn.py':
        'configs/_base_/models/dual_faster_rcnn_r50_fpn.py',
    'mmsafe/configs/_base_/models/dual_faster_rcnn_r18w16_fpn_tiny.py':
        'configs/_base_/models/dual_faster_rcnn_r18w16_fpn_tiny.py',
    'mmsafe/configs/_base_/datasets/llvip.py':
        'configs/_base_/datasets/llvip.py',
    'mmsafe/configs/_base_/datasets/kaist.py':
        'configs/_base_/datasets/kaist.py',
    'mmsafe/configs/_base_/datasets/flir_aligned.py':
        'configs/_base_/datasets/flir_aligned.py',
    'mmsafe/configs/_base_/datasets/m3fd.py':
        'configs/_base_/datasets/m3fd.py',
    'mmsafe/configs/llvip/_base_/runtime_tensorboard.py':
        'configs/llvip/_base_/runtime_tensorboard.py',
    'mmsafe/configs/llvip/demo_cpu.py': 'configs/llvip/demo_cpu.py',
    'mmsafe/configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py':
        'configs/llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py',
    'mmsafe/configs/kaist/dual_faster_rcnn_r50_fpn_macl_kaist.py':
        'configs/kaist/dual_faster_rcnn_r50_fpn_macl_kaist.py',
    'mmsafe/configs/kaist/dual_faster_rcnn_r50_fpn_macl_kaist_sanitized.py':
        'configs/kaist/dual_faster_rcnn_r50_fpn_macl_kaist_sanitized.py',
    'mmsafe/configs/flir/dual_faster_rcnn_r50_fpn_macl_flir_aligned.py':
        'configs/flir/dual_faster_rcnn_r50_fpn_macl_flir_aligned.py',
    'mmsafe/configs/m3fd/dual_faster_rcnn_r50_fpn_macl_m3fd.py':
        'configs/m3fd/dual_faster_rcnn_r50_fpn_macl_m3fd.py',
}


def _run_keys():
    """The config keys a run reads: Runner's arguments and mmsafe's own."""
    from mmengine.runner import Runner
    keys = set(inspect.signature(Runner.__init__).parameters) - {'self',
                                                                 'cfg'}
    return keys | {'runner_type', 'custom_imports', 'log_level',
                   'vis_backends'}


def _plain(value):
    """Classes as their names, mmsafe scope prefixes dropped, containers
    as plain lists and dicts."""
    if inspect.isclass(value) or inspect.isfunction(value):
        return value.__name__
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _load(path):
    import mmsafe  # noqa: F401
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO_ROOT, path))
    return {k: _plain(cfg[k]) for k in cfg.keys()
            if k in _run_keys() or k.startswith('mmsafe_')}


@pytest.mark.parametrize('pure', sorted(TWINS))
def test_pure_python_config_equals_its_text_twin(pure):
    python_style, text_style = _load(pure), _load(TWINS[pure])
    assert python_style.pop('default_scope', 'mmsafe') == \
        text_style.pop('default_scope', 'mmsafe')
    assert set(python_style) == set(text_style)
    for key in sorted(text_style):
        assert python_style[key] == text_style[key], key


def test_every_pure_python_config_has_a_twin():
    import glob
    found = {osp.relpath(p, REPO_ROOT) for p in glob.glob(
        osp.join(REPO_ROOT, 'mmsafe', 'configs', '**', '*.py'),
        recursive=True) if not p.endswith('__init__.py')}
    assert found == set(TWINS), sorted(found ^ set(TWINS))
    for pure, text in TWINS.items():
        assert osp.isfile(osp.join(REPO_ROOT, text)), text

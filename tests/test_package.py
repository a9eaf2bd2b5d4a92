"""The package installs, imports, registers and explains itself."""
import os.path as osp
import re
import subprocess
import sys
import textwrap

import pytest

from tests.utils import REPO_ROOT


def test_import_registers_into_mmdet_registries():
    import mmsafe
    from mmsafe.registry_help import mmsafe_registered_names
    assert isinstance(mmsafe.__version__, str) and mmsafe.__version__
    names = mmsafe_registered_names()
    assert names, 'importing mmsafe registered nothing into mmdet.registry'
    for registry_name, group in names.items():
        assert group, registry_name


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)],
                          cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.parametrize('missing', ['mmdet', 'mmcv', 'mmengine'])
def test_missing_dependency_names_package_and_setup_command(missing):
    # sys.modules[name] = None makes find_spec/import behave as if absent.
    proc = _run_python(f"""
        import sys
        sys.modules[{missing!r}] = None
        import mmsafe
    """)
    assert proc.returncode != 0
    assert 'ImportError' in proc.stderr
    assert f'{missing} is not installed' in proc.stderr
    assert 'tools/setup_env.sh' in proc.stderr
    assert 'KeyError' not in proc.stderr


def test_custom_imports_failure_surfaces_at_config_load(tmp_path):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text("custom_imports = dict(imports=['mmsafe'], "
                   "allow_failed_imports=False)\n")
    proc = _run_python(f"""
        import sys
        sys.modules['mmdet'] = None
        from mmengine.config import Config
        Config.fromfile({str(cfg)!r})
    """)
    assert proc.returncode != 0
    assert 'mmdet is not installed' in proc.stderr


def test_custom_imports_registers_for_default_scope_mmdet(tmp_path):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(textwrap.dedent("""
        default_scope = 'mmdet'
        custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)
    """))
    proc = _run_python(f"""
        from mmengine.config import Config
        from mmengine.registry import init_default_scope
        cfg = Config.fromfile({str(cfg)!r})
        init_default_scope(cfg.default_scope)
        import sys
        assert 'mmsafe' in sys.modules
        from mmsafe.registry_help import mmsafe_registered_names
        print(sum(len(v) for v in mmsafe_registered_names().values()))
    """)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip().splitlines()[-1]) > 0


def test_unknown_type_lists_mmsafe_names_and_close_match():
    import mmsafe  # noqa: F401
    from mmengine.registry import DefaultScope
    from mmsafe.registry_help import mmsafe_registered_names
    from mmdet.registry import MODELS
    model_names = mmsafe_registered_names().get('model')
    assert model_names, 'mmsafe registers no model'
    real = max(model_names, key=len)
    typo = real[:-1]
    from mmsafe.registry_help import explain_unknown_type
    with DefaultScope.overwrite_default_scope('mmdet'):
        with pytest.raises(KeyError) as err:
            MODELS.build(dict(type=typo))
    # MMEngine's own error, unchanged by importing mmsafe ...
    assert 'mmsafe registers in' not in str(err.value)
    # ... made clearer by the tools (tools/train.py, tools/test.py).
    message = str(explain_unknown_type(err.value))
    assert f'{typo} is not in the' in message  # MMEngine's own text kept
    assert f'Did you mean: {real}' in message or real in message.split(
        'Did you mean:')[1]
    assert 'mmsafe registers in the model registry' in message
    for name in model_names:
        assert name in message


def test_a_stack_name_under_the_mmdet_scope_says_how_to_reach_mmsafes():
    """mmsafe's detection stack is not in MMDetection's scope (a project
    may hold those names): the error says how to reach mmsafe's class."""
    import mmsafe  # noqa: F401
    from mmengine.registry import DefaultScope
    from mmdet.registry import DATASETS
    from mmsafe.registry_help import explain_unknown_type
    with DefaultScope.overwrite_default_scope('mmdet'):
        with pytest.raises(KeyError) as err:
            DATASETS.build(dict(type='LLVIPDataset'))
    message = str(explain_unknown_type(err.value))
    # MMEngine's own words (0.7 leaves out the scope)
    assert re.search(r'LLVIPDataset is not in the (mmdet::)?dataset '
                     r'registry', message), message
    assert "type='mmsafe.LLVIPDataset'" in message
    assert "_scope_='mmsafe'" in message
    assert "default_scope = 'mmsafe'" in message
    assert 'Did you mean' not in message


def test_nested_unknown_type_is_explained_once():
    import mmsafe  # noqa: F401
    from mmengine.registry import DefaultScope
    from mmdet.registry import MODELS
    cfg = dict(type='FasterRCNN', backbone=dict(type='NoSuchBackbone'),
               rpn_head=None, roi_head=None, train_cfg=None, test_cfg=None)
    from mmsafe.registry_help import explain_unknown_type
    with DefaultScope.overwrite_default_scope('mmdet'):
        with pytest.raises(KeyError) as err:
            MODELS.build(cfg)
    better = explain_unknown_type(err.value)
    assert 'NoSuchBackbone' in str(better)
    assert str(better).count('mmsafe registers in') == 1
    assert explain_unknown_type(better) is None  # explained once
    assert explain_unknown_type(KeyError('some other key')) is None


def test_train_py_explains_an_unknown_type_name(tmp_path):
    """tools/train.py re-raises MMEngine's unknown-type KeyError with the
    closest mmsafe name (the model is built before any training)."""
    from tests.utils import run_train
    demo = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
    result = run_train(demo, timeout=300, args=[
        '--work-dir', str(tmp_path / 'work'), '--cfg-options',
        'model.type=DualStreamFasterRCN'])
    assert result.returncode != 0, result
    assert 'DualStreamFasterRCN is not in the' in result.output, result
    assert 'Did you mean: DualStreamFasterRCNN' in result.output, result


@pytest.mark.parametrize('module,found', [('torch', '1.13.1'),
                                          ('numpy', '3.0.0'),
                                          ('mmcv', '2.2.0'),
                                          ('mmdet', '3.4.0'),
                                          ('mmengine', '0.6.0')])
def test_out_of_range_version_names_found_and_supported(monkeypatch, module,
                                                        found):
    from mmsafe import _deps
    real = _deps._installed_version
    monkeypatch.setattr(
        _deps, '_installed_version',
        lambda name: found if name == module else real(name))
    with pytest.raises(ImportError) as info:
        _deps.check_dependencies()
    message = str(info.value)
    assert f'{module} {found} is installed' in message, message
    assert 'Supported: Python >= 3.8, torch >= 2.0' in message
    assert 'numpy 1.x or 2.x' in message
    assert 'mmengine 0.7 to 0.10, mmcv 2.0.x or 2.1.0, mmdet 3.0 to 3.3' \
        in message
    # a project's own stack is never replaced: no install command for it
    assert 'changes none of the installed packages' in message
    assert 'pip install' not in message
    assert 'tools/setup_env.sh' in message  # a separate environment


def test_supported_versions_pass_the_check():
    from mmsafe import _deps
    _deps.check_dependencies()  # the suite's own stack is supported


def test_python_requires_matches_the_import_check():
    with open(osp.join(REPO_ROOT, 'pyproject.toml'), encoding='utf-8') as f:
        project = f.read()
    from mmsafe import _deps
    minimum = '.'.join(map(str, _deps.PYTHON_MIN))
    assert f'requires-python = ">={minimum}"' in project
    # the package declares exactly the ranges the import accepts
    for _, requirement, _, _ in _deps.REQUIREMENTS:
        assert f'"{requirement}"' in project, requirement

"""mmsafe inside an RGB-T project that already registers the field's common
names in MMDetection's registries, as forks of MMDetection 3.x do at
``import mmdet``: ``LLVIPDataset``, ``KAISTDataset``, ``M3FDDataset``,
``PairedDetDataPreprocessor``, ``MACLHead``, ``LoadPairedImageFromFile``.

The project (a module the tests write) is imported before and after
mmsafe; its names keep building its classes in the ``mmdet`` scope,
``mmsafe.``-prefixed names build mmsafe's, and one line says so. A run goes
through MMDetection's own ``tools/train.py`` with a text config of the
``mmdet`` scope; tests/test_install.py trains a pure-Python config in such
a project, with mmsafe installed as a package (MMEngine finds a package's
pure-Python configs in its installed folder).
"""
import json
import os
import os.path as osp
import sys

import pytest

from tests.utils import REPO_ROOT, run_command, write_config

PROJECT = 'rgbt_project'
#: the names the project registers, by MMDetection registry
PROJECT_NAMES = {
    'DATASETS': ('LLVIPDataset', 'KAISTDataset', 'M3FDDataset'),
    'MODELS': ('PairedDetDataPreprocessor', 'MACLHead'),
    'TRANSFORMS': ('LoadPairedImageFromFile', ),
}
ANNOUNCE = 'these names belong to your project in the mmdet scope'

PROJECT_SOURCE = '''
"""An RGB-T project's own modules, registered in MMDetection's registries
at import under the field's common names."""
import torch.nn as nn
from mmcv.transforms import BaseTransform
from mmdet.datasets import BaseDetDataset
from mmdet.models.data_preprocessors import DetDataPreprocessor
from mmdet.registry import DATASETS, MODELS, TRANSFORMS
from mmengine.model import BaseModule


@DATASETS.register_module()
class LLVIPDataset(BaseDetDataset):
    def load_data_list(self):
        return []


@DATASETS.register_module()
class KAISTDataset(LLVIPDataset):
    pass


@DATASETS.register_module()
class M3FDDataset(LLVIPDataset):
    pass


@MODELS.register_module()
class PairedDetDataPreprocessor(DetDataPreprocessor):
    pass


@MODELS.register_module()
class MACLHead(BaseModule):
    def __init__(self, in_dim=256, **kwargs):
        super().__init__()
        self.proj = nn.Linear(in_dim, 8)


@TRANSFORMS.register_module()
class LoadPairedImageFromFile(BaseTransform):
    def transform(self, results):
        return results
'''


@pytest.fixture(scope='module')
def project_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp('proj')
    with open(root / f'{PROJECT}.py', 'w', encoding='utf-8') as f:
        f.write(PROJECT_SOURCE)
    return str(root)


def _env(project_dir):
    return {'PYTHONPATH': os.pathsep.join(
        [REPO_ROOT, project_dir, os.environ.get('PYTHONPATH', '')])}


CHECK = '''
import importlib, json, sys
order = sys.argv[1].split(',')
for name in order:
    importlib.import_module(name)
    print(f'IMPORTED {name}', flush=True)
from mmsafe.registry_help import announce_scope
announce_scope()  # what SafeRunner does when it is built
print('RUNNER BUILT', flush=True)
announce_scope()  # said once: nothing new now
print('AGAIN', flush=True)

from mmengine.registry import DefaultScope
from mmdet.registry import DATASETS, HOOKS, MODELS, OPTIM_WRAPPERS, TRANSFORMS
from mmsafe.registry import resolve
registries = dict(DATASETS=DATASETS, MODELS=MODELS, TRANSFORMS=TRANSFORMS)
names = json.loads(sys.argv[2])
owner = {}
for scope in ('mmdet', 'mmsafe'):
    with DefaultScope.overwrite_default_scope(scope):
        for reg, group in names.items():
            for name in group:
                for typ in (name, f'mmsafe.{name}', f'mmdet.{name}'):
                    cls = resolve(registries[reg], typ)
                    owner[f'{scope}:{typ}'] = cls.__module__.split('.')[0]
        head = MODELS.build(dict(type='mmsafe.MACLHead', in_dim=4,
                                 proj_dim=4, hidden_dim=4))
        owner[f'{scope}:build mmsafe.MACLHead'] = \\
            type(head).__module__.split('.')[0]
        head = MODELS.build(dict(type='mmdet.MACLHead', in_dim=4))
        owner[f'{scope}:build mmdet.MACLHead'] = \\
            type(head).__module__.split('.')[0]
        hook = HOOKS.build(dict(type='DataLoaderProbeHook'))
        owner[f'{scope}:build DataLoaderProbeHook'] = \\
            type(hook).__module__.split('.')[0]
        wrapper = OPTIM_WRAPPERS.get('NaNSkipOptimWrapper')
        owner[f'{scope}:NaNSkipOptimWrapper'] = \\
            wrapper.__module__.split('.')[0]
print('RESULT ' + json.dumps(owner))
'''


@pytest.mark.parametrize('order', [(PROJECT, 'mmsafe'), ('mmsafe', PROJECT)],
                         ids=['project-first', 'mmsafe-first'])
def test_project_names_and_mmsafe_names_side_by_side(project_dir, order):
    result = run_command(
        [sys.executable, '-c', CHECK, ','.join(order),
         json.dumps(PROJECT_NAMES)], timeout=240, env=_env(project_dir))
    assert result.returncode == 0, result
    out = result.output
    # one line: at mmsafe's import when the project came first, else when
    # the runner is built; never a second time
    assert out.count(ANNOUNCE) == 1, out
    said = out.index(ANNOUNCE)
    if order[0] == PROJECT:
        assert said < out.index('IMPORTED mmsafe'), out
    else:
        assert out.index(f'IMPORTED {PROJECT}') < said < out.index(
            'RUNNER BUILT'), out
    line = next(x for x in out.splitlines() if ANNOUNCE in x)
    for group in PROJECT_NAMES.values():
        for name in group:
            assert f'{name} ({PROJECT})' in line, line
    assert 'mmsafe.<Name>' in line
    owner = json.loads(out.split('RESULT ', 1)[1].splitlines()[0])
    for group in PROJECT_NAMES.values():
        for name in group:
            # the mmdet scope: the project's; its prefix: mmsafe's
            assert owner[f'mmdet:{name}'] == PROJECT, name
            assert owner[f'mmdet:mmsafe.{name}'] == 'mmsafe', name
            # the mmsafe scope: mmsafe's first; mmdet.Name: the project's
            assert owner[f'mmsafe:{name}'] == 'mmsafe', name
            assert owner[f'mmsafe:mmdet.{name}'] == PROJECT, name
    for scope in ('mmdet', 'mmsafe'):
        assert owner[f'{scope}:build mmsafe.MACLHead'] == 'mmsafe'
        assert owner[f'{scope}:build mmdet.MACLHead'] == PROJECT
        # mmsafe's machinery by plain name in both scopes
        assert owner[f'{scope}:build DataLoaderProbeHook'] == 'mmsafe'
        assert owner[f'{scope}:NaNSkipOptimWrapper'] == 'mmsafe'


def _mmdet_train_py():
    import mmdet
    path = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools',
                    'train.py')
    if not osp.isfile(path):
        pytest.skip(f'this MMDetection install has no {path}')
    return path


#: a tiny synthetic LLVIP tree: 2 training iterations of 4 pairs
SYNTHETIC = ('dict(num_train=8, num_test=4, img_size=(96, 80), seed=0, '
             'max_people=3, empty_ratio=0.25, person_height=(20, 60))')


def test_mmdet_train_py_with_an_mmdet_scope_config(project_dir, tmp_path):
    """A project's text config (``default_scope='mmdet'``, the project
    imported after mmsafe) takes mmsafe's safety fragment and mmsafe's
    demo model and data (``_scope_='mmsafe'``), and trains through
    MMDetection's own tools/train.py."""
    train_py = _mmdet_train_py()
    work = str(tmp_path / 'w')
    cfg = write_config(str(tmp_path / 'proj_cfg.py'), f'''
        _base_ = [{osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')!r}]
        default_scope = 'mmdet'
        custom_imports = dict(imports=['mmsafe', {PROJECT!r}],
                              allow_failed_imports=False)
        data_root = {str(tmp_path / 'data') + '/'!r}
        synthetic = {SYNTHETIC}
        model = dict(_scope_='mmsafe')
        train_dataloader = dict(dataset=dict(
            _scope_='mmsafe', data_root=data_root, synthetic=synthetic))
        val_dataloader = dict(dataset=dict(
            _scope_='mmsafe', data_root=data_root, synthetic=synthetic))
        test_dataloader = val_dataloader
        val_evaluator = [dict(_scope_='mmsafe', **e)
                         for e in _base_.val_evaluator]
        test_evaluator = val_evaluator
        train_cfg = dict(max_epochs=1, val_interval=1)
        custom_hooks = [h for h in _base_.custom_hooks
                        if h['type'] != 'MACLCheckHook']
        ''')
    result = run_command([sys.executable, train_py, cfg, '--work-dir', work],
                         timeout=420, env=_env(project_dir))
    assert result.returncode == 0, result
    assert 'SafeRunner' in result.output  # runner_type, from MMEngine's
    line = next(x for x in result.output.splitlines() if ANNOUNCE in x)
    assert f'MACLHead ({PROJECT})' in line, line
    assert 'pascal_voc/mAP' in result.output
    report = json.load(open(osp.join(work, 'safety_report.json')))
    assert report['status'] == 'finished', report

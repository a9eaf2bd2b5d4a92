"""mmsafe installs into an MMDetection environment a user already has.

The wheel is built from the clone, its contents are checked, and it is
installed into a new virtual environment that sees the test environment's
packages (torch, mmcv, mmengine, mmdet: the user's stack) but not the
clone's mmsafe. From a folder outside the clone, the installed commands
then run on configs named by scope (``mmsafe::...``, ``mmdet::...``): the
preflight tool and 20 training iterations of MMDetection's own Faster R-CNN
config with mmsafe's safety runtime as a second base, on the demo data, and
the dataset check of the demo config.
"""
import os
import os.path as osp
import site
import subprocess
import sys
import textwrap
import zipfile

import pytest

from tests.utils import REPO_ROOT, run_command

pytestmark = pytest.mark.slow

COMMANDS = ('mmsafe-train', 'mmsafe-test', 'mmsafe-check-dataset',
            'mmsafe-preflight', 'mmsafe-eval-kaist', 'mmsafe-make-m3fd-split',
            'mmsafe-convert-checkpoint')


def _run(cmd, cwd, env=None, timeout=600):
    result = run_command(cmd, timeout=timeout, cwd=cwd, env=env)
    assert result.returncode == 0 and not result.timed_out, result
    return result.output


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    """The wheel of this clone (built once, without network access)."""
    out = tmp_path_factory.mktemp('wheel')
    # a copy of the tree: building writes build/ and *.egg-info/ beside
    # the sources, and the clone stays as it was
    src = out / 'src'
    _copy_tree(REPO_ROOT, str(src))
    _run([sys.executable, '-m', 'pip', 'wheel', '--no-deps',
          '--no-build-isolation', '--no-index', '-w', str(out / 'dist'),
          str(src)], cwd=str(out))
    wheels = sorted((out / 'dist').glob('mmsafe-*.whl'))
    assert len(wheels) == 1, wheels
    return str(wheels[0])


def _copy_tree(src: str, dst: str) -> None:
    """The files git knows (tracked and untracked, not ignored): what a
    fresh clone with the change has, without venvs, data or work dirs."""
    listed = subprocess.run(
        ['git', 'ls-files', '-z', '--cached', '--others',
         '--exclude-standard'], cwd=src, capture_output=True, check=True)
    for rel in listed.stdout.decode().split('\0'):
        if not rel or not osp.isfile(osp.join(src, rel)):
            continue
        target = osp.join(dst, rel)
        os.makedirs(osp.dirname(target), exist_ok=True)
        with open(osp.join(src, rel), 'rb') as f_in, \
                open(target, 'wb') as f_out:
            f_out.write(f_in.read())


def test_the_wheel_holds_mmsafe_its_configs_and_tools_only(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next(n.split('/')[0] for n in names
                         if n.split('/')[0].endswith('.dist-info'))
        top_level = {n.split('/')[0] for n in names}
        entry_points = zf.read(f'{dist_info}/entry_points.txt').decode()
        metadata = zf.read(f'{dist_info}/METADATA').decode()
    assert top_level == {'mmsafe', dist_info}, sorted(top_level)
    for rel in ('_base_/safety_runtime.py', 'llvip/demo_cpu.py',
                'llvip/dual_faster_rcnn_r50_fpn_macl_llvip.py',
                'kaist/dual_faster_rcnn_r50_fpn_macl_kaist.py'):
        assert f'mmsafe/.mim/configs/{rel}' in names, rel
    for tool in ('train.py', 'test.py', 'check_dataset.py', 'preflight.py',
                 'eval_kaist.py', 'make_m3fd_split.py', 'convert_checkpoint.py',
                 'dist_train.sh'):
        assert f'mmsafe/.mim/tools/{tool}' in names, tool
    assert 'mmsafe/.mim/tools/setup_env.sh' not in names
    assert not [n for n in names if '/tests/' in n or n.startswith(
        ('tests/', 'benchmarks/')) or '__pycache__' in n]
    for command in COMMANDS:
        assert f'{command} = mmsafe.tools.' in entry_points, command
    assert 'Requires-Dist: mmdet' in metadata


def _stack_without_mmsafe(view: str) -> None:
    """Links to every entry of this environment's site-packages except
    mmsafe's own (its editable install): the user's MMDetection stack."""
    os.makedirs(view)
    for folder in site.getsitepackages():
        for name in os.listdir(folder):
            low = name.lower()
            if (low.startswith(('mmsafe', '__editable__')) or
                    low.endswith(('.pth', '.egg-link'))
                    or osp.lexists(osp.join(view, name))):
                continue
            os.symlink(osp.join(folder, name), osp.join(view, name))


@pytest.fixture(scope='module')
def user_env(tmp_path_factory, wheel):
    """A new virtual environment with the user's stack and the wheel."""
    root = tmp_path_factory.mktemp('userenv')
    env_dir = str(root / 'venv')
    _run([sys.executable, '-m', 'venv', env_dir], cwd=str(root))
    python = osp.join(env_dir, 'bin', 'python')
    purelib = subprocess.run(
        [python, '-c', 'import sysconfig; '
         'print(sysconfig.get_paths()["purelib"])'],
        capture_output=True, text=True, check=True).stdout.strip()
    view = str(root / 'stack')
    _stack_without_mmsafe(view)
    with open(osp.join(purelib, 'user_stack.pth'), 'w') as f:
        f.write(view + '\n')
    # the clone is not on the path (run_command would put it there)
    env = dict(PYTHONPATH='', PYTHONDONTWRITEBYTECODE='1',
               PATH=osp.join(env_dir, 'bin') + os.pathsep +
               os.environ['PATH'])
    work = root / 'work'
    work.mkdir()
    # before the install: this environment has the stack, not mmsafe
    out = _run([python, '-c', 'import importlib.util as u, mmdet; '
                'print(mmdet.__version__, u.find_spec("mmsafe"))'],
               cwd=str(work), env=env)
    assert out.split()[-1] == 'None', out
    _run([python, '-m', 'pip', 'install', '--no-deps', '--no-index',
          wheel], cwd=str(work), env=env)
    return dict(python=python, env=env, work=str(work), bin=osp.join(
        env_dir, 'bin'), site=purelib)


def test_the_installed_package_is_the_wheels(user_env):
    out = _run([user_env['python'], '-c',
                'import mmsafe; print(mmsafe.__file__)'],
               cwd=user_env['work'], env=user_env['env'])
    path = out.strip().splitlines()[-1]
    assert path.startswith(user_env['site']), path
    assert not path.startswith(REPO_ROOT)
    for command in COMMANDS:
        assert osp.isfile(osp.join(user_env['bin'], command)), command


def _user_config(work: str) -> str:
    """MMDetection's Faster R-CNN config, mmsafe's safety runtime as a
    second base, trained on the visible images of the demo data."""
    path = osp.join(work, 'faster_rcnn_safe.py')
    with open(path, 'w') as f:
        f.write(textwrap.dedent("""
            _base_ = [
                'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
                'mmsafe::_base_/safety_runtime.py',
            ]
            data_root = 'data/demo/'
            # ResNet-18 and no ImageNet weights: small and offline; fewer
            # RoIs, each sampled 2x2 per bin (RoIAlign dominates on CPU)
            model = dict(
                backbone=dict(depth=18, init_cfg=None),
                neck=dict(in_channels=[64, 128, 256, 512]),
                roi_head=dict(
                    bbox_roi_extractor=dict(
                        roi_layer=dict(sampling_ratio=2)),
                    bbox_head=dict(num_classes=1)),
                train_cfg=dict(rpn_proposal=dict(max_per_img=256),
                               rcnn=dict(sampler=dict(num=128))))
            train_pipeline = [
                dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', with_bbox=True),
                dict(type='Resize', scale=(160, 128), keep_ratio=True),
                dict(type='RandomFlip', prob=0.5),
                dict(type='PackDetInputs'),
            ]
            train_dataloader = dict(
                batch_size=2, num_workers=0, persistent_workers=False,
                sampler=dict(type='InfiniteSampler', shuffle=True),
                batch_sampler=None,
                dataset=dict(
                    _delete_=True, type='mmsafe.LLVIPDataset',
                    data_root=data_root,
                    return_modality_pair=False,
                    synthetic=dict(num_train=12, num_test=4,
                                   img_size=(160, 128), seed=0),
                    filter_cfg=dict(filter_empty_gt=True),
                    pipeline=train_pipeline))
            val_dataloader = None
            val_cfg = None
            val_evaluator = None
            test_dataloader = None
            test_cfg = None
            test_evaluator = None
            train_cfg = dict(_delete_=True, type='IterBasedTrainLoop',
                             max_iters=20, val_interval=1000)
            param_scheduler = []
            optim_wrapper = dict(type='NaNSkipOptimWrapper',
                                 optimizer=dict(lr=0.002))
            default_hooks = dict(
                logger=dict(interval=5),
                checkpoint=dict(by_epoch=False, interval=20))
        """))
    return path


def test_installed_tools_run_configs_named_by_scope(user_env):
    work, env, bin_dir = user_env['work'], user_env['env'], user_env['bin']
    config = _user_config(work)
    # exit code 0: no check is an error
    _run([osp.join(bin_dir, 'mmsafe-preflight'), config, '--work-dir',
          'work_dirs/preflight'], cwd=work, env=env)

    out = _run([osp.join(bin_dir, 'mmsafe-train'), config,
                '--work-dir', 'work_dirs/train'], cwd=work, env=env)
    assert 'iteration 20/20' in out, out[-3000:]
    assert osp.isfile(osp.join(work, 'work_dirs', 'train', 'iter_20.pth'))
    # the guards of the safety runtime ran (built from scope mmsafe)
    assert osp.isfile(osp.join(work, 'work_dirs', 'train',
                               'safety_report.json'))

    out = _run([osp.join(bin_dir, 'mmsafe-check-dataset'),
                'mmsafe::llvip/demo_cpu.py', '--limit', '8', '--workers',
                '0', '--no-progress', '--no-alignment', '--cfg-options',
                'train_dataloader.dataset.synthetic.num_train=8'],
               cwd=work, env=env)
    assert 'check_dataset: OK' in out, out[-3000:]


def test_pure_python_config_trains_the_demo_in_a_project(user_env):
    """A pure-Python config reads mmsafe's demo recipe (and with it the
    safety fragment) by module path, in a project that registered the
    field's common names before mmsafe was imported (a fork's ``import
    mmdet``)."""
    from mmengine import config as mmengine_config
    if not hasattr(mmengine_config, 'read_base'):
        pytest.skip('this MMEngine has no pure-Python configs (0.8+)')
    from tests.test_user_project import ANNOUNCE, PROJECT, PROJECT_SOURCE
    work, env = user_env['work'], user_env['env']
    with open(osp.join(work, f'{PROJECT}.py'), 'w') as f:
        f.write(PROJECT_SOURCE)
    config = osp.join(work, 'pure_demo.py')
    with open(config, 'w') as f:
        f.write(textwrap.dedent("""
            from mmengine.config import read_base

            with read_base():
                from mmsafe.configs.llvip.demo_cpu import *  # noqa

            data_root = 'data/pure_demo/'
            synthetic = dict(num_train=8, num_test=4, img_size=(96, 80),
                             seed=0, max_people=3, empty_ratio=0.25,
                             person_height=(20, 60))
            train_dataloader.dataset.update(data_root=data_root,
                                            synthetic=synthetic)
            val_dataloader.dataset.update(data_root=data_root,
                                          synthetic=synthetic)
            test_dataloader = val_dataloader
            train_cfg.update(max_epochs=1, val_interval=1)
            # without the MACL check (2 iterations are no MACL training)
            custom_hooks = custom_hooks[:5] + custom_hooks[6:]
        """))
    launch = textwrap.dedent(f"""
        import runpy, sys
        import {PROJECT}  # the project's names first
        sys.argv = ['train', {config!r}, '--work-dir', 'work_dirs/pure']
        runpy.run_module('mmsafe.tools.train', run_name='__main__')
        """)
    out = _run([user_env['python'], '-c', launch], cwd=work, env=env)
    assert out.count(ANNOUNCE) == 1, out[-3000:]
    assert 'pascal_voc/mAP' in out, out[-3000:]
    report = osp.join(work, 'work_dirs', 'pure', 'safety_report.json')
    with open(report) as f:
        assert '"status": "finished"' in f.read()

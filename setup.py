"""Build steps that pyproject.toml cannot express: the ``.mim`` folder.

OpenMMLab packages ship their configs and tools inside the package, under
``<package>/.mim/``: MMEngine resolves ``mmsafe::_base_/safety_runtime.py``
to ``mmsafe/.mim/configs/_base_/safety_runtime.py``, and ``mim train
mmsafe CONFIG`` runs ``mmsafe/.mim/tools/train.py``. A wheel gets copies of
the clone's ``configs/`` and ``tools/`` there; an editable install gets
links to them (kept out of git), so both resolve the same names.
"""
import os
import os.path as osp
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = osp.dirname(osp.abspath(__file__))
#: clone folder -> name under mmsafe/.mim/
MIM_FILES = {'configs': 'configs', 'tools': 'tools'}
#: mim's index of model metafiles. MMEngine reads it before it looks for a
#: ``pkg::`` config (a missing file is an error); mmsafe lists none.
MODEL_INDEX = 'Import: []\n'
#: what of tools/ an installed package has no use for
TOOLS_LEFT_OUT = ('setup_env.sh', 'setup_env.bat', 'setup_plan.py')


def _tools_left_out(folder, names):
    return [n for n in names
            if n in TOOLS_LEFT_OUT or n == '__pycache__' or n.endswith('.pyc')]


def _skip_cache(folder, names):
    return [n for n in names if n == '__pycache__' or n.endswith('.pyc')]


class BuildWithMim(build_py):
    """``build_py`` plus ``mmsafe/.mim/{configs,tools}``: copied into the
    build (a wheel), linked in the source tree (an editable install)."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            _link_mim(osp.join(ROOT, 'mmsafe', '.mim'))
        else:
            _copy_mim(osp.join(self.build_lib, 'mmsafe', '.mim'))


def _write_model_index(target):
    with open(osp.join(target, 'model-index.yml'), 'w') as f:
        f.write(MODEL_INDEX)


def _copy_mim(target):
    os.makedirs(target, exist_ok=True)
    _write_model_index(target)
    for src, name in MIM_FILES.items():
        dst = osp.join(target, name)
        if osp.lexists(dst):
            shutil.rmtree(dst)
        shutil.copytree(osp.join(ROOT, src), dst,
                        ignore=_tools_left_out if src == 'tools' else _skip_cache)


def _link_mim(target):
    os.makedirs(target, exist_ok=True)
    _write_model_index(target)
    for src, name in MIM_FILES.items():
        dst = osp.join(target, name)
        if osp.islink(dst) or osp.exists(dst):
            continue
        try:
            os.symlink(osp.join('..', '..', src), dst)
        except OSError:  # no symlinks (Windows without the right): copy
            shutil.copytree(osp.join(ROOT, src), dst, ignore=_skip_cache)


setup(cmdclass={'build_py': BuildWithMim})

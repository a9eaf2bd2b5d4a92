"""Dependency check that runs before anything imports MMDetection.

A config with ``custom_imports=dict(imports=['mmsafe'])`` on a machine that
lacks one of mmsafe's dependencies must fail here, naming what is missing and
how to install it, rather than with a registry ``KeyError`` much later.
"""
import importlib.util
import sys

from packaging.version import Version

from mmsafe.errors import MMSafeImportError

#: for a missing dependency: how to install mmsafe's stack
SETUP_HINT = ('To make a new environment: `bash tools/setup_env.sh` from the '
              'mmsafe checkout (Windows: `tools\\setup_env.bat`). Into an '
              'environment of your own: torch first, then mmengine, '
              '`pip install "setuptools<70" wheel && MMCV_WITH_OPS=1 pip '
              'install --no-build-isolation "mmcv>=2.0.0,<2.2.0"`, mmdet, '
              'then mmsafe.')
#: for an installed release outside the range: nothing is reinstalled for
#: the user (their project pins its own MMDetection, mmcv and torch)
RANGE_HINT = ('mmsafe changes none of the installed packages. Keep your '
              'project\'s stack and choose a release of the package named '
              'above inside the supported range yourself, or make a separate '
              'environment with `bash tools/setup_env.sh` from the mmsafe '
              'checkout.')

#: the Python versions the package's syntax and standard library need
#: (measured with vermin) and that torch 2.0 starts from
PYTHON_MIN = (3, 8)

SUPPORTED = ('Supported: Python >= 3.8, torch >= 2.0, numpy 1.x or 2.x, '
             'mmengine 0.7 to 0.10, mmcv 2.0.x or 2.1.0, mmdet 3.0 to 3.3 '
             '(the releases MMDetection 3.0 to 3.3 accept).')

# (import name, pip requirement, minimum version inclusive, maximum exclusive)
# The supported stack: what MMDetection 3.0 to 3.3 accept, from torch 2.0
# (what OpenMMLab's prebuilt mmcv 2.0.1 wheels target) to the newest
# release, numpy 1.x and 2.x.
REQUIREMENTS = (
    ('torch', 'torch>=2.0', '2.0.0', None),
    ('numpy', 'numpy>=1.22,<3', '1.22.0', '3.0.0'),
    ('mmengine', 'mmengine>=0.7.1,<1', '0.7.1', '1.0.0'),
    ('mmcv', 'mmcv>=2.0.0,<2.2.0', '2.0.0', '2.2.0'),
    ('mmdet', 'mmdet>=3.0,<3.4', '3.0.0', '3.4.0'),
)


def _installed_version(name: str):
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - python < 3.8
        return None
    for dist in (name, name.replace('_', '-'), 'mmcv-full' if name == 'mmcv'
                 else name):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def check_dependencies() -> None:
    """Raise ``ImportError`` naming every missing or out-of-range dependency.

    Raises:
        ImportError: when a dependency is absent, has the wrong version, or
            mmcv was installed without its compiled ops (``mmcv-lite``).
    """
    problems, out_of_range = [], False
    if sys.version_info[:2] < PYTHON_MIN:
        problems.append(
            f'Python {sys.version.split()[0]} is too old: mmsafe needs '
            f'Python >= {".".join(map(str, PYTHON_MIN))}')
    for module, requirement, low, high in REQUIREMENTS:
        if importlib.util.find_spec(module) is None:
            problems.append(f'{module} is not installed (need {requirement})')
            continue
        found = _installed_version(module)
        if found is None or (low is None and high is None):
            continue
        base = Version(Version(found).base_version)
        if (low and base < Version(low)) or (high and base >= Version(high)):
            problems.append(
                f'{module} {found} is installed but mmsafe supports '
                f'{requirement}')
            out_of_range = True
    if not problems and importlib.util.find_spec('mmcv._ext') is None:
        problems.append(
            'mmcv is installed without its compiled ops (mmcv._ext is '
            'missing; MMDetection needs RoIAlign and NMS). Reinstall mmcv '
            'with MMCV_WITH_OPS=1')
    if not problems:
        from mmsafe.compat.mmengine_features import config_text_problem
        problem = config_text_problem()
        if problem:
            problems.append(problem)
    if problems:
        hint = RANGE_HINT if out_of_range else SETUP_HINT
        raise MMSafeImportError('mmsafe cannot be imported: ' +
                                '; '.join(problems) + '. ' + SUPPORTED + ' ' +
                                hint)

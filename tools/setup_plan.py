"""What ``tools/setup_env.sh`` and ``tools/setup_env.bat`` install.

Both set-up scripts ask this file, so that they choose alike. It needs only
the standard library (it runs before torch is installed) and prints
``KEY=VALUE`` lines that the scripts read::

    python tools/setup_plan.py stack    # MMCV_VERSION, MMENGINE_REQ,
                                        # MMDET_REQ, STACK
    python tools/setup_plan.py torch    # TORCH_REQ, TORCH_INDEX, NOTE
    python tools/setup_plan.py mmcv     # MMCV_INDEX, MMCV_WHEEL_DIR, NOTE
    python tools/setup_plan.py mmcv-wheel TORCH_REQ  # MMCV_WHEEL=maybe|no
                                        # (before torch is installed)
    python tools/setup_plan.py numpy-pin  # the constraints this torch's
                                          # numpy ABI needs (one a line)
    python tools/setup_plan.py numpy    # exit 1 when torch cannot use the
                                        # installed numpy

The default stack is the one for which OpenMMLab publishes prebuilt mmcv
2.1.0 wheels: torch 2.1.2, the CUDA 12.1 build when an NVIDIA GPU is present,
the CPU build otherwise. Python 3.12 and newer have no torch 2.1 wheel; the
oldest torch that has one is taken instead, and mmcv is built from source.

Three named stacks (``MMSAFE_STACK``) span what mmsafe supports:

    default  torch 2.1.2, mmcv 2.1.0, mmengine 0.10.7, mmdet 3.3.0 (above)
    oldest   torch 2.0.1, mmcv 2.0.1, mmengine 0.7.4, mmdet 3.0.0: what
             RGB-T projects on MMDetection 3.0/3.1 run (OpenMMLab's
             prebuilt mmcv 2.0.1 wheels stop at torch 2.0)
    newest   the newest torch that mmcv 2.1.0 builds against here, mmcv
             2.1.0, mmengine 0.10.7, mmdet 3.3.0

Variables (all optional):
    MMSAFE_STACK         ``default`` (if unset), ``oldest`` or ``newest``
    MMSAFE_TORCH         torch requirement (then no default is applied)
    MMSAFE_MMCV          mmcv version (e.g. ``2.0.1``), MMSAFE_MMENGINE and
    MMSAFE_MMDET         pip requirements of mmengine and mmdet: each
                         replaces the stack's choice
    MMSAFE_TORCH_INDEX   extra index for torch; ``none``: PyPI only
    MMSAFE_MMCV_INDEX    find-links URL of prebuilt mmcv wheels; ``none``:
                         build from source
    MMSAFE_GPU           ``1``/``0``: force the CUDA/CPU choice
    MMSAFE_CACHE_DIR     where source-built mmcv wheels are kept, one folder
                         per torch build (default: ~/.cache/mmsafe, or
                         %LOCALAPPDATA%\\mmsafe on Windows)
"""
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import urllib.request

DEFAULT_TORCH = '2.1.2'
MMCV_VERSION = '2.1.0'
#: each named stack: torch (None: the default's rule), mmcv, mmengine, mmdet
STACKS = {
    'default': (None, MMCV_VERSION, 'mmengine==0.10.7', 'mmdet==3.3.0'),
    'oldest': ('torch==2.0.1', '2.0.1', 'mmengine==0.7.4', 'mmdet==3.0.0'),
    'newest': ('torch==2.13.0', MMCV_VERSION, 'mmengine==0.10.7',
               'mmdet==3.3.0'),
}
#: constraints a stack needs for every install: mmengine before 0.10 calls
#: yapf's FormatCode(verify=...), which yapf 0.40.2 removed
STACK_PINS = {'oldest': ('yapf<=0.40.1', )}
#: the C++ standard each mmcv release compiles its ops with (newer: 17)
MMCV_CXX = {'2.0': 14}
#: the oldest torch release with a wheel for Python versions newer than the
#: default's (torch 2.1 has wheels for Python 3.8-3.11)
OLDEST_TORCH_FOR_PYTHON = {(3, 12): '2.2.2', (3, 13): '2.5.1',
                           (3, 14): '2.9.1'}
TORCH_CUDA_INDEX = 'https://download.pytorch.org/whl/cu121'
#: torch releases whose CUDA builds are not on the CUDA 12.1 index
TORCH_CUDA_INDEX_FOR = {'2.9.1': 'https://download.pytorch.org/whl/cu126'}
TORCH_CPU_INDEX = 'https://download.pytorch.org/whl/cpu'
MMCV_INDEX = 'https://download.openmmlab.com/mmcv/dist/{tag}/torch{mm}/' \
    'index.html'
PROBE_TIMEOUT = 10.0


def reachable(url: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether ``url`` answers (any HTTP status below 400) within
    ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status < 400
    except Exception:  # unreachable, refused, 404, TLS: all mean "no"
        return False


def gpu_present(env=None) -> bool:
    """An NVIDIA GPU that ``nvidia-smi`` lists (``MMSAFE_GPU`` overrides)."""
    env = os.environ if env is None else env
    forced = env.get('MMSAFE_GPU', '')
    if forced in ('0', '1'):
        return forced == '1'
    smi = shutil.which('nvidia-smi')
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, '-L'], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and 'GPU' in out.stdout


def default_torch(version=None):
    """``(torch version, note)`` for this Python: torch 2.1.2 up to Python
    3.11, else the oldest release that has a wheel for it."""
    version = tuple(version or sys.version_info[:2])
    if version <= (3, 11):
        return DEFAULT_TORCH, ''
    py = '.'.join(map(str, version))
    oldest = OLDEST_TORCH_FOR_PYTHON.get(version)
    if oldest is None:
        return None, (f'Python {py} has no torch {DEFAULT_TORCH} wheel and '
                      'no known oldest torch: installing the newest torch '
                      '(set MMSAFE_TORCH to choose)')
    return oldest, (f'Python {py} has no torch {DEFAULT_TORCH} wheel '
                    f'(those stop at Python 3.11): taking torch {oldest}, '
                    'the oldest release with one. OpenMMLab publishes no '
                    'prebuilt mmcv for it, so mmcv is built from source; '
                    'use Python 3.8-3.11 for the prebuilt stack')


def stack_name(env=None) -> str:
    """The chosen stack (``MMSAFE_STACK``, default ``default``).

    Raises:
        SystemExit: an unknown stack name (the message lists the known).
    """
    env = os.environ if env is None else env
    name = env.get('MMSAFE_STACK', '') or 'default'
    if name not in STACKS:
        raise SystemExit(f'MMSAFE_STACK={name!r} is not a stack: choose one '
                         f'of {", ".join(sorted(STACKS))}')
    return name


def plan_stack(env=None):
    """mmcv's version and the mmengine and mmdet requirements of the chosen
    stack, each replaced by its variable when set."""
    env = os.environ if env is None else env
    name = stack_name(env)
    _, mmcv, mmengine, mmdet = STACKS[name]
    return dict(STACK=name, MMCV_VERSION=env.get('MMSAFE_MMCV') or mmcv,
                MMENGINE_REQ=env.get('MMSAFE_MMENGINE') or mmengine,
                MMDET_REQ=env.get('MMSAFE_MMDET') or mmdet,
                PINS=' '.join(STACK_PINS.get(name, ())))


def plan_torch(env=None, probe=None, gpu=None):
    """The torch requirement, its extra index and a note for the user."""
    env = os.environ if env is None else env
    probe = probe or reachable
    gpu = gpu or (lambda: gpu_present(env))
    index = env.get('MMSAFE_TORCH_INDEX', '')
    stack_torch = STACKS[stack_name(env)][0]
    if env.get('MMSAFE_TORCH') or stack_torch:
        return dict(TORCH_REQ=env.get('MMSAFE_TORCH') or stack_torch,
                    TORCH_INDEX='' if index == 'none' else index, NOTE='')
    version, note = default_torch()
    req = f'torch=={version}' if version else 'torch'
    notes = [note] if note else []
    if index == 'none':
        index = ''
    elif not index:
        cuda = gpu()
        cuda_index = TORCH_CUDA_INDEX_FOR.get(version, TORCH_CUDA_INDEX)
        index = cuda_index if cuda else TORCH_CPU_INDEX
        build = f'CUDA {cuda_index[-3:-1]}.{cuda_index[-1]}' if cuda \
            else 'CPU'
        if not probe(index + '/torch/'):
            notes.append(
                f'{index} is not reachable: installing PyPI\'s {req} '
                f'instead of its {build} build (on Linux PyPI\'s build is '
                'a CUDA one of about 2.7 GB, which runs on the CPU too)')
            index = ''
    return dict(TORCH_REQ=req, TORCH_INDEX=index, NOTE='; '.join(notes))


def cache_root(env=None) -> str:
    env = os.environ if env is None else env
    if env.get('MMSAFE_CACHE_DIR'):
        return env['MMSAFE_CACHE_DIR']
    if os.name == 'nt' and env.get('LOCALAPPDATA'):
        return osp.join(env['LOCALAPPDATA'], 'mmsafe')
    home_cache = osp.join(osp.expanduser('~'), '.cache')
    base = env.get('XDG_CACHE_HOME') or home_cache
    return osp.join(base, 'mmsafe')


def mmcv_wheels_of(version: str, env=None) -> str:
    """The folder of source-built mmcv ``version`` wheels, holding one
    folder per torch build (:func:`mmcv_build_key`)."""
    return osp.join(cache_root(env), 'wheels', f'mmcv-{version}')


def mmcv_build_key(torch_version: str, cuda_ops: bool, py=None) -> str:
    """One folder per torch build: pip's own cache keys a built wheel by its
    source only, so a wheel built against another torch would be reused."""
    py = tuple(py or sys.version_info[:2])
    ops = 'cudaops' if cuda_ops else 'cpuops'
    return f'torch{torch_version}-{ops}-cp{py[0]}{py[1]}'


def aten_cxx_standard(torch_dir: str):
    """The C++ standard that torch's ATen headers demand (14, 17, 20 ...),
    or None when they say nothing: mmcv 2.1.0 compiles its ops with
    ``-std=c++17`` and mmcv 2.0.x with ``-std=c++14``, so a torch whose
    headers need a newer standard cannot build that mmcv."""
    header = osp.join(torch_dir, 'include', 'ATen', 'ATen.h')
    try:
        with open(header, encoding='utf-8', errors='replace') as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(r'#error C\+\+(\d+) or later compatible compiler',
                      text)
    return int(match.group(1)) if match else None


def plan_mmcv(env=None, probe=None):
    """Where a prebuilt mmcv may be found and where a built one is kept.

    Runs with the environment's Python, torch installed.
    """
    import torch
    env = os.environ if env is None else env
    probe = probe or reachable
    version = plan_stack(env)['MMCV_VERSION']
    cuda = torch.version.cuda
    tag = 'cu' + cuda.replace('.', '') if cuda else 'cpu'
    major_minor = '.'.join(torch.__version__.split('+')[0].split('.')[:2])
    cuda_ops = bool(torch.cuda.is_available()
                    or env.get('FORCE_CUDA', '') == '1')
    wheel_dir = osp.join(mmcv_wheels_of(version, env),
                         mmcv_build_key(torch.__version__, cuda_ops))
    index = env.get('MMSAFE_MMCV_INDEX', '')
    note = ''
    if not index:
        index = MMCV_INDEX.format(tag=tag, mm=major_minor)
        if not probe(index):
            note = (f'no prebuilt mmcv {version} for torch '
                    f'{torch.__version__} at {index} (OpenMMLab publishes '
                    'mmcv 2.1.0 for torch 2.1 and older, 2.0.1 for torch '
                    '2.0 and older), or it is not reachable')
            index = 'none'
    where = getattr(torch, '__file__', None)
    standard = aten_cxx_standard(osp.dirname(where)) if where else None
    build = 'ok'
    compiles = MMCV_CXX.get('.'.join(version.split('.')[:2]), 17)
    if standard and standard > compiles:
        newest = 'torch 2.0' if compiles == 14 else 'torch 2.13'
        build = (f'torch {torch.__version__} needs C++{standard} for '
                 f'extensions and mmcv {version} compiles its ops as '
                 f'C++{compiles}: mmcv cannot be built for this torch. Use '
                 f'{newest} or older (MMSAFE_TORCH=torch==2.1.2, the '
                 'default, with mmcv 2.1.0), or a prebuilt mmcv wheel '
                 '(MMSAFE_MMCV_INDEX)')
    return dict(MMCV_INDEX=index, MMCV_WHEEL_DIR=wheel_dir, NOTE=note,
                MMCV_BUILD=build)


def mmcv_wheel_before_torch(torch_req: str, env=None, probe=None):
    """Whether mmcv may be had without compiling it, asked before
    ``torch_req`` is installed (``MMSAFE_MMCV_BUILD=never`` then stops
    before torch's download of up to 2.7 GB).

    ``MMCV_WHEEL=no`` only when that is certain: ``torch_req`` pins one
    release (``torch==X``), no wheel built earlier for torch X lies in
    the cache, and OpenMMLab's index for torch X.Y answers for neither
    the CPU nor the CUDA 12.1 build (or ``MMSAFE_MMCV_INDEX=none``).
    Anything else is ``maybe``, and :func:`plan_mmcv` decides once torch
    is installed.
    """
    import glob
    env = os.environ if env is None else env
    probe = probe or reachable
    version = plan_stack(env)['MMCV_VERSION']
    pinned = re.fullmatch(r'torch==([0-9][0-9.]*)', torch_req.strip())
    if not pinned:
        return dict(MMCV_WHEEL='maybe', NOTE='')
    torch_version = pinned.group(1)
    py = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    build_dirs = f'torch{glob.escape(torch_version)}[+-]*{py}'
    built = glob.glob(osp.join(glob.escape(mmcv_wheels_of(version, env)),
                               build_dirs, f'mmcv-{version}-*.whl'))
    if built:
        return dict(MMCV_WHEEL='maybe', NOTE='')
    index = env.get('MMSAFE_MMCV_INDEX', '')
    if index and index != 'none':
        return dict(MMCV_WHEEL='maybe', NOTE='')
    major_minor = '.'.join(torch_version.split('.')[:2])
    if index != 'none' and any(
            probe(MMCV_INDEX.format(tag=tag, mm=major_minor))
            for tag in ('cpu', 'cu121')):
        return dict(MMCV_WHEEL='maybe', NOTE='')
    where = 'MMSAFE_MMCV_INDEX=none' if index == 'none' else \
        f'OpenMMLab\'s index for torch {major_minor} does not answer'
    return dict(MMCV_WHEEL='no', NOTE=(
        f'no mmcv {version} wheel for torch {torch_version} can be had '
        f'without compiling ({where}; none built earlier in '
        f'{cache_root(env)})'))


#: what a torch built against numpy 1.x needs held for every install (numpy
#: 2 cannot be loaded by it; opencv >= 4.11 requires numpy 2)
NUMPY1_PINS = ('numpy<2', 'opencv-python<4.11', 'opencv-python-headless<4.11')
#: the module that extensions built against numpy 2 import first (numpy 1
#: builds name only ``numpy.core._multiarray_umath``)
NUMPY2_IMPORT = b'numpy._core._multiarray_umath'
NUMPY1_IMPORT = b'numpy.core._multiarray_umath'


def torch_numpy_abi():
    """1 or 2: the numpy major version torch's binding was built against,
    read from the library without importing torch (None when not found)."""
    import glob
    import importlib.util
    spec = importlib.util.find_spec('torch')
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for lib in glob.glob(osp.join(folder, 'lib', '*torch_python*')):
            with open(lib, 'rb') as f:
                data = f.read()
            if NUMPY2_IMPORT in data:
                return 2
            if NUMPY1_IMPORT in data:
                return 1
    return None


def numpy_pins() -> list:
    """Constraints for every install after torch's: numpy<2 (and an opencv
    that still takes numpy 1) for a torch built against numpy 1.x."""
    return list(NUMPY1_PINS) if torch_numpy_abi() == 1 else []


def numpy_usable() -> str:
    """'' when torch exchanges arrays with the installed numpy, else why
    not (a torch built against numpy 1.x cannot use numpy 2)."""
    import numpy
    import torch
    try:
        ok = torch.from_numpy(numpy.arange(3.0)).sum().item() == 3.0
    except Exception as err:  # torch's "Numpy is not available" and kin
        return f'{type(err).__name__}: {err}'
    return '' if ok else 'torch.from_numpy returned wrong values'


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    what = argv[0] if argv else ''
    if what == 'stack':
        plan = plan_stack()
    elif what == 'torch':
        plan = plan_torch()
    elif what == 'mmcv':
        plan = plan_mmcv()
    elif what == 'mmcv-wheel' and len(argv) == 2:
        plan = mmcv_wheel_before_torch(argv[1])
    elif what == 'numpy-pin':
        for line in numpy_pins():
            print(line)
        return 0
    elif what == 'numpy':
        problem = numpy_usable()
        if problem:
            print(f'torch cannot use numpy: {problem}')
        return 1 if problem else 0
    else:
        print(__doc__)
        return 2
    for key, value in plan.items():
        print(f'{key}={value}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

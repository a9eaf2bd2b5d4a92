"""What ``tools/setup_env.sh`` and ``tools/setup_env.bat`` install.

Both set-up scripts ask this file, so that they choose alike. It needs only
the standard library (it runs before torch is installed) and prints
``KEY=VALUE`` lines that the scripts read::

    python tools/setup_plan.py torch    # TORCH_REQ, TORCH_INDEX, NOTE
    python tools/setup_plan.py mmcv     # MMCV_INDEX, MMCV_WHEEL_DIR, NOTE
    python tools/setup_plan.py numpy-pin  # the constraints this torch's
                                          # numpy ABI needs (one a line)
    python tools/setup_plan.py numpy    # exit 1 when torch cannot use the
                                        # installed numpy

The default stack is the one for which OpenMMLab publishes prebuilt mmcv
2.1.0 wheels: torch 2.1.2, the CUDA 12.1 build when an NVIDIA GPU is present,
the CPU build otherwise. Python 3.12 and newer have no torch 2.1 wheel; the
oldest torch that has one is taken instead, and mmcv is built from source.

Variables (all optional):
    MMSAFE_TORCH         torch requirement (then no default is applied)
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
import shutil
import subprocess
import sys
import urllib.request

DEFAULT_TORCH = '2.1.2'
MMCV_VERSION = '2.1.0'
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


def plan_torch(env=None, probe=None, gpu=None):
    """The torch requirement, its extra index and a note for the user."""
    env = os.environ if env is None else env
    probe = probe or reachable
    gpu = gpu or (lambda: gpu_present(env))
    index = env.get('MMSAFE_TORCH_INDEX', '')
    if env.get('MMSAFE_TORCH'):
        return dict(TORCH_REQ=env['MMSAFE_TORCH'],
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


def mmcv_build_key(torch_version: str, cuda_ops: bool, py=None) -> str:
    """One folder per torch build: pip's own cache keys a built wheel by its
    source only, so a wheel built against another torch would be reused."""
    py = tuple(py or sys.version_info[:2])
    ops = 'cudaops' if cuda_ops else 'cpuops'
    return f'torch{torch_version}-{ops}-cp{py[0]}{py[1]}'


def aten_cxx_standard(torch_dir: str):
    """The C++ standard that torch's ATen headers demand (17, 20, ...), or
    None when they say nothing: mmcv 2.1.0 compiles its ops with
    ``-std=c++17``, so a torch whose headers need C++20 cannot build it."""
    import re
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
    cuda = torch.version.cuda
    tag = 'cu' + cuda.replace('.', '') if cuda else 'cpu'
    major_minor = '.'.join(torch.__version__.split('+')[0].split('.')[:2])
    cuda_ops = bool(torch.cuda.is_available()
                    or env.get('FORCE_CUDA', '') == '1')
    wheel_dir = osp.join(cache_root(env), 'wheels', f'mmcv-{MMCV_VERSION}',
                         mmcv_build_key(torch.__version__, cuda_ops))
    index = env.get('MMSAFE_MMCV_INDEX', '')
    note = ''
    if not index:
        index = MMCV_INDEX.format(tag=tag, mm=major_minor)
        if not probe(index):
            note = (f'no prebuilt mmcv {MMCV_VERSION} for torch '
                    f'{torch.__version__} at {index} (OpenMMLab publishes '
                    'them for torch 2.1 and older), or it is not reachable')
            index = 'none'
    where = getattr(torch, '__file__', None)
    standard = aten_cxx_standard(osp.dirname(where)) if where else None
    build = 'ok'
    if standard and standard > 17:
        build = (f'torch {torch.__version__} needs C++{standard} for '
                 f'extensions and mmcv {MMCV_VERSION} compiles its ops as '
                 'C++17: mmcv cannot be built for this torch. Use torch 2.14 '
                 'or older (MMSAFE_TORCH=torch==2.1.2, the default), or a '
                 'prebuilt mmcv wheel (MMSAFE_MMCV_INDEX)')
    return dict(MMCV_INDEX=index, MMCV_WHEEL_DIR=wheel_dir, NOTE=note,
                MMCV_BUILD=build)


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
    if what == 'torch':
        plan = plan_torch()
    elif what == 'mmcv':
        plan = plan_mmcv()
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

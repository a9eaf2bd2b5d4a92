"""tools/setup_plan.py, in-process: what the set-up scripts install.

The planner is a stand-alone script, loaded here by path. Nothing here
reaches the network: the probes are stand-ins, and ``urllib``'s
``urlopen`` fails any test that would call it.
"""
import importlib.util
import os.path as osp
import subprocess
import sys
import types
import urllib.error

import pytest

from tests.utils import REPO_ROOT, load_module_from_path

# the scripts (launchers, benchmarks), the planner and the docs do not
# depend on the stack: run at one end (tests/conftest.py)
pytestmark = pytest.mark.one_end

PLAN_PY = osp.join(REPO_ROOT, 'tools', 'setup_plan.py')
CU121 = 'https://download.pytorch.org/whl/cu121'
CPU = 'https://download.pytorch.org/whl/cpu'
PY = f'cp{sys.version_info[0]}{sys.version_info[1]}'


sp = load_module_from_path('mmsafe_setup_plan', PLAN_PY)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any real probe fails the test (``reachable`` would hide the error)."""
    opened = []

    def urlopen(url, *args, **kwargs):
        opened.append(url)
        raise OSError('no network in these tests')

    monkeypatch.setattr(sp.urllib.request, 'urlopen', urlopen)
    yield
    assert opened == [], f'tried to reach {opened}'


class Probe:
    """Stand-in for ``reachable``: answers ``answer``, records the URLs."""

    def __init__(self, answer: bool):
        self.answer = answer
        self.urls = []

    def __call__(self, url):
        self.urls.append(url)
        return self.answer


def gpu(present: bool):
    calls = []

    def answer():
        calls.append(present)
        return present

    answer.calls = calls
    return answer


def fake_torch(version='2.1.2+cu121', cuda='12.1', available=True,
               from_numpy=None):
    return types.SimpleNamespace(
        __version__=version, version=types.SimpleNamespace(cuda=cuda),
        cuda=types.SimpleNamespace(is_available=lambda: available),
        from_numpy=from_numpy)


# --- torch ------------------------------------------------------------------

@pytest.mark.parametrize('version', [(3, 8), (3, 9), (3, 10), (3, 11)])
def test_default_torch_is_2_1_2_up_to_python_3_11(version):
    assert sp.default_torch(version) == ('2.1.2', '')


def test_default_torch_python_3_12_takes_the_oldest_torch_with_a_wheel():
    version, note = sp.default_torch((3, 12))
    assert version == '2.2.2'
    assert 'Python 3.12 has no torch 2.1.2 wheel' in note
    assert 'taking torch 2.2.2' in note
    assert 'mmcv is built from source' in note
    assert '\n' not in note  # one KEY=VALUE line


def test_default_torch_python_3_13_and_an_unknown_future_python():
    version, note = sp.default_torch((3, 13))
    assert version == '2.5.1' and 'taking torch 2.5.1' in note
    version, note = sp.default_torch((3, 99))
    assert version is None
    assert 'Python 3.99' in note and 'MMSAFE_TORCH' in note


def test_default_torch_without_argument_is_this_pythons():
    assert sp.default_torch() == sp.default_torch(sys.version_info[:2])


@pytest.mark.parametrize('present,index', [(True, CU121), (False, CPU)])
def test_plan_torch_gpu_chooses_the_cuda_or_cpu_index(present, index):
    probe, has_gpu = Probe(True), gpu(present)
    plan = sp.plan_torch(env={}, probe=probe, gpu=has_gpu)
    version, note = sp.default_torch()
    assert plan == dict(TORCH_REQ=f'torch=={version}', TORCH_INDEX=index,
                        NOTE=note)
    assert probe.urls == [index + '/torch/']
    assert has_gpu.calls == [present]


def test_plan_torch_on_python_3_12(monkeypatch):
    default_torch = sp.default_torch
    monkeypatch.setattr(sp, 'default_torch', lambda: default_torch((3, 12)))
    plan = sp.plan_torch(env={}, probe=Probe(True), gpu=gpu(False))
    assert plan == dict(TORCH_REQ='torch==2.2.2', TORCH_INDEX=CPU,
                        NOTE=default_torch((3, 12))[1])


def test_plan_torch_unknown_python_takes_the_newest_torch(monkeypatch):
    default_torch = sp.default_torch
    monkeypatch.setattr(sp, 'default_torch', lambda: default_torch((3, 99)))
    plan = sp.plan_torch(env={}, probe=Probe(True), gpu=gpu(True))
    assert plan['TORCH_REQ'] == 'torch'
    assert plan['TORCH_INDEX'] == CU121
    assert 'Python 3.99' in plan['NOTE']


@pytest.mark.parametrize('present,build', [(True, 'CUDA 12.1'),
                                           (False, 'CPU')])
def test_plan_torch_unreachable_index_falls_back_to_pypi(present, build):
    probe = Probe(False)
    plan = sp.plan_torch(env={}, probe=probe, gpu=gpu(present))
    index = CU121 if present else CPU
    req = f'torch=={sp.default_torch()[0]}'
    assert probe.urls == [index + '/torch/']
    assert plan['TORCH_REQ'] == req
    assert plan['TORCH_INDEX'] == ''
    assert (f"{index} is not reachable: installing PyPI's {req} instead of "
            f'its {build} build') in plan['NOTE']


def test_plan_torch_unreachable_index_keeps_the_python_note(monkeypatch):
    default_torch = sp.default_torch
    monkeypatch.setattr(sp, 'default_torch', lambda: default_torch((3, 12)))
    plan = sp.plan_torch(env={}, probe=Probe(False), gpu=gpu(False))
    first, second = plan['NOTE'].split('; use Python 3.8-3.11 for the '
                                       'prebuilt stack; ')
    assert first.startswith('Python 3.12 has no torch 2.1.2 wheel')
    assert second.startswith(f'{CPU} is not reachable: installing PyPI\'s '
                             'torch==2.2.2')


def test_plan_torch_index_none_is_pypi_without_probe_or_gpu_check():
    probe, has_gpu = Probe(True), gpu(True)
    plan = sp.plan_torch(env=dict(MMSAFE_TORCH_INDEX='none'), probe=probe,
                         gpu=has_gpu)
    assert plan == dict(TORCH_REQ=f'torch=={sp.default_torch()[0]}',
                        TORCH_INDEX='', NOTE=sp.default_torch()[1])
    assert probe.urls == [] and has_gpu.calls == []


def test_plan_torch_given_index_is_taken_as_is():
    probe, has_gpu = Probe(False), gpu(True)
    index = 'https://download.pytorch.org/whl/cu118'
    plan = sp.plan_torch(env=dict(MMSAFE_TORCH_INDEX=index), probe=probe,
                         gpu=has_gpu)
    assert plan['TORCH_INDEX'] == index
    assert probe.urls == [] and has_gpu.calls == []


@pytest.mark.parametrize('index,expected', [
    (None, ''), ('none', ''),
    ('https://download.pytorch.org/whl/cu118',
     'https://download.pytorch.org/whl/cu118')])
def test_plan_torch_user_torch_is_returned_unchanged(index, expected):
    env = dict(MMSAFE_TORCH='torch==2.3.1')
    if index is not None:
        env['MMSAFE_TORCH_INDEX'] = index
    probe, has_gpu = Probe(False), gpu(True)
    plan = sp.plan_torch(env=env, probe=probe, gpu=has_gpu)
    assert plan == dict(TORCH_REQ='torch==2.3.1', TORCH_INDEX=expected,
                        NOTE='')
    assert probe.urls == [] and has_gpu.calls == []


# --- GPU, network probe -----------------------------------------------------

def test_gpu_present_forced_by_mmsafe_gpu(monkeypatch):
    monkeypatch.setattr(sp.shutil, 'which', lambda name: pytest.fail(
        'nvidia-smi looked up although MMSAFE_GPU decides'))
    monkeypatch.setenv('MMSAFE_GPU', '1')
    assert sp.gpu_present() is True
    monkeypatch.setenv('MMSAFE_GPU', '0')
    assert sp.gpu_present() is False


@pytest.mark.parametrize('which,rc,stdout,expected', [
    (None, 0, '', False),  # no nvidia-smi
    ('/usr/bin/nvidia-smi', 0,
     'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n', True),
    ('/usr/bin/nvidia-smi', 9,
     'NVIDIA-SMI has failed because it could not communicate with the '
     'NVIDIA driver.\n', False),
    ('/usr/bin/nvidia-smi', 0, 'No devices found.\n', False)])
def test_gpu_present_asks_nvidia_smi(monkeypatch, which, rc, stdout,
                                     expected):
    ran = []

    def run(argv, **kwargs):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, rc, stdout, '')

    monkeypatch.delenv('MMSAFE_GPU', raising=False)
    monkeypatch.setattr(sp.shutil, 'which', lambda name: which)
    monkeypatch.setattr(sp.subprocess, 'run', run)
    assert sp.gpu_present() is expected
    assert ran == ([] if which is None else [[which, '-L']])


def test_gpu_present_nvidia_smi_hanging_means_no_gpu(monkeypatch):
    def run(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs.get('timeout'))

    monkeypatch.delenv('MMSAFE_GPU', raising=False)
    monkeypatch.setattr(sp.shutil, 'which', lambda name: '/bin/nvidia-smi')
    monkeypatch.setattr(sp.subprocess, 'run', run)
    assert sp.gpu_present() is False


def test_reachable_answers_from_the_http_status(monkeypatch):
    class Response:
        def __init__(self, status):
            self.status = status

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    asked = []

    def urlopen(url, timeout):
        asked.append((url, timeout))
        if 'refused' in url:
            raise urllib.error.URLError('connection refused')
        return Response(200 if 'ok' in url else 302)

    monkeypatch.setattr(sp.urllib.request, 'urlopen', urlopen)
    assert sp.reachable('https://x/ok/') is True
    assert sp.reachable('https://x/moved/', timeout=3) is True
    assert sp.reachable('https://x/refused/') is False
    assert asked == [('https://x/ok/', sp.PROBE_TIMEOUT),
                     ('https://x/moved/', 3),
                     ('https://x/refused/', sp.PROBE_TIMEOUT)]


# --- mmcv -------------------------------------------------------------------

def test_cache_root(monkeypatch, tmp_path):
    assert sp.cache_root(dict(MMSAFE_CACHE_DIR='/c/mm')) == '/c/mm'
    assert sp.cache_root(dict(XDG_CACHE_HOME='/x')) == '/x/mmsafe'
    monkeypatch.setenv('HOME', str(tmp_path))
    assert sp.cache_root({}) == osp.join(str(tmp_path), '.cache', 'mmsafe')
    with monkeypatch.context() as m:
        m.setattr(sp.os, 'name', 'nt')
        local = sp.cache_root(dict(LOCALAPPDATA='/L'))
        given = sp.cache_root(dict(LOCALAPPDATA='/L', MMSAFE_CACHE_DIR='/c'))
    assert local == osp.join('/L', 'mmsafe')
    assert given == '/c'


def test_mmcv_build_key_differs_per_torch_build():
    key = sp.mmcv_build_key
    assert key('2.1.2+cu121', True, (3, 11)) == \
        'torch2.1.2+cu121-cudaops-cp311'
    keys = {key('2.1.2+cu121', True, (3, 11)),
            key('2.1.2+cpu', True, (3, 11)),
            key('2.1.2+cu121', False, (3, 11)),
            key('2.2.2+cu121', True, (3, 11)),
            key('2.1.2+cu121', True, (3, 10))}
    assert len(keys) == 5
    assert key('2.1.2', False) == f'torch2.1.2-cpuops-{PY}'


def test_plan_mmcv_prebuilt_index_for_this_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, 'torch', fake_torch())
    probe = Probe(True)
    plan = sp.plan_mmcv(env=dict(MMSAFE_CACHE_DIR='/cache'), probe=probe)
    index = ('https://download.openmmlab.com/mmcv/dist/cu121/torch2.1/'
             'index.html')
    assert plan == dict(
        MMCV_INDEX=index, NOTE='', MMCV_WHEEL_DIR=osp.join(
            '/cache', 'wheels', 'mmcv-2.1.0',
            f'torch2.1.2+cu121-cudaops-{PY}'), MMCV_BUILD='ok')
    assert probe.urls == [index]


def test_plan_mmcv_unreachable_index_means_source_build(monkeypatch):
    monkeypatch.setitem(sys.modules, 'torch', fake_torch(
        '2.2.2+cpu', cuda=None, available=False))
    probe = Probe(False)
    plan = sp.plan_mmcv(env=dict(MMSAFE_CACHE_DIR='/cache'), probe=probe)
    index = ('https://download.openmmlab.com/mmcv/dist/cpu/torch2.2/'
             'index.html')
    assert probe.urls == [index]
    assert plan['MMCV_INDEX'] == 'none'
    assert plan['NOTE'].startswith(
        f'no prebuilt mmcv 2.1.0 for torch 2.2.2+cpu at {index}')
    assert plan['MMCV_WHEEL_DIR'] == osp.join(
        '/cache', 'wheels', 'mmcv-2.1.0', f'torch2.2.2+cpu-cpuops-{PY}')


def test_plan_mmcv_wheel_folder_per_torch_build(monkeypatch):
    env = dict(MMSAFE_CACHE_DIR='/cache', MMSAFE_MMCV_INDEX='none')
    folders = set()
    for torch in (fake_torch('2.1.2+cu121', '12.1', True),
                  fake_torch('2.1.2+cpu', None, False),
                  fake_torch('2.2.2+cu121', '12.1', True)):
        monkeypatch.setitem(sys.modules, 'torch', torch)
        folders.add(sp.plan_mmcv(env=env, probe=Probe(True))[
            'MMCV_WHEEL_DIR'])
    assert len(folders) == 3
    # FORCE_CUDA builds the CUDA ops without a visible GPU, as mmcv does.
    monkeypatch.setitem(sys.modules, 'torch', fake_torch(available=False))
    assert sp.plan_mmcv(env=env, probe=Probe(True))['MMCV_WHEEL_DIR'] \
        .endswith(f'-cpuops-{PY}')
    assert sp.plan_mmcv(env=dict(env, FORCE_CUDA='1'), probe=Probe(True))[
        'MMCV_WHEEL_DIR'].endswith(f'-cudaops-{PY}')


@pytest.mark.parametrize('index', ['https://mirror.example/mmcv/index.html',
                                   'none'])
def test_plan_mmcv_given_index_is_taken_without_probe(monkeypatch, index):
    monkeypatch.setitem(sys.modules, 'torch', fake_torch())
    probe = Probe(False)
    plan = sp.plan_mmcv(env=dict(MMSAFE_MMCV_INDEX=index,
                                 MMSAFE_CACHE_DIR='/c'), probe=probe)
    assert plan['MMCV_INDEX'] == index and plan['NOTE'] == ''
    assert probe.urls == []


# --- numpy, the command line ----------------------------------------------

def test_numpy_usable_in_this_environment():
    assert sp.numpy_usable() == ''


def test_numpy_usable_reports_a_torch_built_against_numpy_1(monkeypatch):
    def from_numpy(array):
        raise RuntimeError('Numpy is not available')

    monkeypatch.setitem(sys.modules, 'torch', fake_torch(
        from_numpy=from_numpy))
    assert sp.numpy_usable() == 'RuntimeError: Numpy is not available'


def lines(capsys):
    return capsys.readouterr().out.splitlines()


def test_main_prints_key_value_lines(monkeypatch, capsys):
    monkeypatch.delenv('MMSAFE_TORCH', raising=False)
    monkeypatch.setenv('MMSAFE_TORCH_INDEX', 'none')
    assert sp.main(['torch']) == 0
    version, note = sp.default_torch()
    assert lines(capsys) == [f'TORCH_REQ=torch=={version}', 'TORCH_INDEX=',
                             f'NOTE={note}']
    monkeypatch.setenv('MMSAFE_TORCH', 'torch==2.3.1')
    monkeypatch.setenv('MMSAFE_TORCH_INDEX', CU121)
    assert sp.main(['torch']) == 0
    assert lines(capsys) == ['TORCH_REQ=torch==2.3.1', f'TORCH_INDEX={CU121}',
                             'NOTE=']
    monkeypatch.setitem(sys.modules, 'torch', fake_torch())
    monkeypatch.setenv('MMSAFE_MMCV_INDEX', 'none')
    monkeypatch.setenv('MMSAFE_CACHE_DIR', '/c')
    assert sp.main(['mmcv']) == 0
    assert lines(capsys) == [
        'MMCV_INDEX=none',
        'MMCV_WHEEL_DIR=' + osp.join('/c', 'wheels', 'mmcv-2.1.0',
                                     f'torch2.1.2+cu121-cudaops-{PY}'),
        'NOTE=', 'MMCV_BUILD=ok']


def test_main_numpy_exit_code(monkeypatch, capsys):
    assert sp.main(['numpy']) == 0
    assert lines(capsys) == []

    def from_numpy(array):
        raise RuntimeError('Numpy is not available')

    monkeypatch.setitem(sys.modules, 'torch', fake_torch(
        from_numpy=from_numpy))
    assert sp.main(['numpy']) == 1
    assert lines(capsys) == [
        'torch cannot use numpy: RuntimeError: Numpy is not available']


def test_main_without_a_known_command_prints_usage(capsys):
    assert sp.main([]) == 2
    assert sp.main(['torchvision']) == 2
    out = capsys.readouterr().out
    assert out.count('python tools/setup_plan.py torch') == 2


def _torch_folder(tmp_path, monkeypatch, library: bytes):
    """A torch package folder whose binding holds ``library``, found by
    find_spec as the installed torch would be."""
    folder = tmp_path / 'torch'
    (folder / 'lib').mkdir(parents=True)
    (folder / 'lib' / 'libtorch_python.so').write_bytes(library)
    spec = types.SimpleNamespace(submodule_search_locations=[str(folder)])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec',
                        lambda name, *a: spec if name == 'torch'
                        else real(name, *a))


@pytest.mark.parametrize('library,abi,pins', [
    (b'\x00numpy.core._multiarray_umath\x00', 1, list(sp.NUMPY1_PINS)),
    (b'\x00numpy._core._multiarray_umath\x00numpy.core._multiarray_umath',
     2, []),
    (b'\x00no numpy here\x00', None, [])])
def test_numpy_pins_follow_the_abi_torch_was_built_against(
        tmp_path, monkeypatch, library, abi, pins):
    _torch_folder(tmp_path, monkeypatch, library)
    assert sp.torch_numpy_abi() == abi
    assert sp.numpy_pins() == pins


def test_numpy_abi_of_the_installed_torch_agrees_with_numpy():
    """The torch of this environment: built against numpy 2 where numpy 2
    is installed and usable; numpy 1 builds are pinned."""
    import numpy
    abi = sp.torch_numpy_abi()
    assert abi in (1, 2)
    if numpy.__version__.startswith('2'):
        assert abi == 2 and sp.numpy_usable() == ''
    else:
        assert sp.numpy_pins() == ([] if abi == 2 else list(sp.NUMPY1_PINS))


def test_main_numpy_pin_prints_one_pin_a_line(tmp_path, monkeypatch,
                                              capsys):
    _torch_folder(tmp_path, monkeypatch, b'numpy.core._multiarray_umath')
    assert sp.main(['numpy-pin']) == 0
    assert capsys.readouterr().out.splitlines() == list(sp.NUMPY1_PINS)


@pytest.mark.parametrize('header,standard', [
    ('#if !defined(_MSC_VER) && __cplusplus < 201703L\n'
     '#error C++17 or later compatible compiler is required to use ATen.\n',
     17),
    ('#if (!defined(_MSVC_LANG) && __cplusplus < 202002L)\n'
     '#error C++20 or later compatible compiler is required to use ATen.\n',
     20),
    ('// nothing said\n', None)])
def test_aten_cxx_standard_read_from_the_headers(tmp_path, header, standard):
    (tmp_path / 'include' / 'ATen').mkdir(parents=True)
    (tmp_path / 'include' / 'ATen' / 'ATen.h').write_text(header)
    assert sp.aten_cxx_standard(str(tmp_path)) == standard
    assert sp.aten_cxx_standard(str(tmp_path / 'missing')) is None


def test_plan_mmcv_says_when_this_torch_cannot_build_mmcv(monkeypatch):
    import torch
    monkeypatch.setattr(sp, 'aten_cxx_standard', lambda folder: 20)
    plan = sp.plan_mmcv(env=dict(MMSAFE_MMCV_INDEX='none'))
    assert plan['MMCV_BUILD'].startswith(
        f'torch {torch.__version__} needs C++20 for extensions')
    monkeypatch.setattr(sp, 'aten_cxx_standard', lambda folder: 17)
    assert sp.plan_mmcv(env=dict(MMSAFE_MMCV_INDEX='none'))[
        'MMCV_BUILD'] == 'ok'


# --- named stacks ----------------------------------------------------------

@pytest.mark.parametrize('name,torch_req,mmcv,mmengine,mmdet', [
    ('oldest', 'torch==2.0.1', '2.0.1', 'mmengine==0.7.4', 'mmdet==3.0.0'),
    ('newest', sp.STACKS['newest'][0], '2.1.0', 'mmengine==0.10.7',
     'mmdet==3.3.0'),
])
def test_a_named_stack_chooses_torch_mmcv_mmengine_and_mmdet(
        name, torch_req, mmcv, mmengine, mmdet):
    env = dict(MMSAFE_STACK=name)
    plan = sp.plan_stack(env)
    assert plan['STACK'] == name
    assert (plan['MMCV_VERSION'], plan['MMENGINE_REQ'], plan['MMDET_REQ']) \
        == (mmcv, mmengine, mmdet)
    probe = Probe(True)
    torch_plan = sp.plan_torch(env=env, probe=probe, gpu=gpu(False))
    assert torch_plan['TORCH_REQ'] == torch_req
    assert probe.urls == []  # a pinned torch: PyPI's, unless an index is set


def test_the_default_stack_and_its_overrides():
    plan = sp.plan_stack({})
    assert (plan['STACK'], plan['MMCV_VERSION'], plan['MMENGINE_REQ'],
            plan['MMDET_REQ'], plan['PINS']) == (
        'default', '2.1.0', 'mmengine==0.10.7', 'mmdet==3.3.0', '')
    plan = sp.plan_stack(dict(MMSAFE_STACK='oldest', MMSAFE_MMCV='2.0.0',
                              MMSAFE_MMDET='mmdet==3.1.0'))
    assert (plan['MMCV_VERSION'], plan['MMENGINE_REQ'], plan['MMDET_REQ']) \
        == ('2.0.0', 'mmengine==0.7.4', 'mmdet==3.1.0')
    # MMEngine before 0.10 passes verify= to yapf, which 0.40.2 removed
    assert plan['PINS'] == 'yapf<=0.40.1'
    # the user's torch wins over the stack's
    assert sp.plan_torch(env=dict(MMSAFE_STACK='oldest',
                                  MMSAFE_TORCH='torch==2.0.0'),
                         probe=Probe(True), gpu=gpu(False))[
        'TORCH_REQ'] == 'torch==2.0.0'


def test_an_unknown_stack_names_the_stacks():
    with pytest.raises(SystemExit, match="MMSAFE_STACK='old' is not a stack"
                       ": choose one of default, newest, oldest"):
        sp.plan_stack(dict(MMSAFE_STACK='old'))


def test_plan_mmcv_2_0_builds_with_torch_2_0_headers_only(monkeypatch):
    """mmcv 2.0.x compiles its ops as C++14: torch 2.0's headers take it,
    torch 2.1's (C++17) do not."""
    env = dict(MMSAFE_STACK='oldest', MMSAFE_MMCV_INDEX='none',
               MMSAFE_CACHE_DIR='/c')
    monkeypatch.setattr(sp, 'aten_cxx_standard', lambda folder: 14)
    plan = sp.plan_mmcv(env=env)
    assert plan['MMCV_BUILD'] == 'ok'
    assert osp.join('wheels', 'mmcv-2.0.1') in plan['MMCV_WHEEL_DIR']
    monkeypatch.setattr(sp, 'aten_cxx_standard', lambda folder: 17)
    build = sp.plan_mmcv(env=env)['MMCV_BUILD']
    assert 'needs C++17' in build and 'mmcv 2.0.1 compiles its ops as ' \
        'C++14' in build and 'Use torch 2.0 or older' in build


def test_main_stack_prints_key_value_lines(monkeypatch, capsys):
    monkeypatch.setenv('MMSAFE_STACK', 'oldest')
    assert sp.main(['stack']) == 0
    lines = dict(line.split('=', 1)
                 for line in capsys.readouterr().out.splitlines())
    assert lines == dict(STACK='oldest', MMCV_VERSION='2.0.1',
                         MMENGINE_REQ='mmengine==0.7.4',
                         MMDET_REQ='mmdet==3.0.0', PINS='yapf<=0.40.1')


def test_mmcv_wheel_before_torch_no_only_when_certain(tmp_path):
    env = dict(MMSAFE_CACHE_DIR=str(tmp_path))
    cpu = ('https://download.openmmlab.com/mmcv/dist/cpu/torch2.1/'
           'index.html')
    cuda = cpu.replace('/cpu/', '/cu121/')
    probe = Probe(False)
    plan = sp.mmcv_wheel_before_torch('torch==2.1.2', env=env, probe=probe)
    assert plan['MMCV_WHEEL'] == 'no' and probe.urls == [cpu, cuda]
    assert 'torch 2.1.2' in plan['NOTE'] and str(tmp_path) in plan['NOTE']
    # OpenMMLab's index answers for one build: the full plan decides later
    assert sp.mmcv_wheel_before_torch(
        'torch==2.1.2', env=env, probe=Probe(True))['MMCV_WHEEL'] == 'maybe'
    # a range or an unpinned torch: its release is not known yet
    for req in ('torch', 'torch>=2.1', 'torch==2.1.*'):
        assert sp.mmcv_wheel_before_torch(
            req, env=env, probe=Probe(False))['MMCV_WHEEL'] == 'maybe'
    # a user's own index is not probed here
    given = dict(env, MMSAFE_MMCV_INDEX='https://example.org/mmcv/')
    assert sp.mmcv_wheel_before_torch(
        'torch==2.1.2', env=given, probe=Probe(False))['MMCV_WHEEL'] == \
        'maybe'
    # no index at all and nothing built: certain, without a probe
    none = dict(env, MMSAFE_MMCV_INDEX='none')
    probe = Probe(True)
    assert sp.mmcv_wheel_before_torch(
        'torch==2.1.2', env=none, probe=probe)['MMCV_WHEEL'] == 'no'
    assert probe.urls == []
    # a wheel built earlier for this torch release (any build of it)
    built = tmp_path / 'wheels' / 'mmcv-2.1.0' / \
        f'torch2.1.2+cu121-cpuops-{PY}'
    built.mkdir(parents=True)
    (built / f'mmcv-2.1.0-{PY}-{PY}-linux_x86_64.whl').write_bytes(b'')
    assert sp.mmcv_wheel_before_torch(
        'torch==2.1.2', env=none, probe=Probe(False))['MMCV_WHEEL'] == \
        'maybe'
    # ... but not one for another release that shares the prefix
    assert sp.mmcv_wheel_before_torch(
        'torch==2.1.20', env=none, probe=Probe(False))['MMCV_WHEEL'] == 'no'

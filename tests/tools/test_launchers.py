"""The launchers, run for real.

- tools/train_with_tensorboard.bat and tools/setup_env.bat under a real
  ``cmd`` (wine's), with stand-in ``python.exe``/``powershell.exe``
  (compiled from launcher_stub.c) and browser that record how the batch
  files call them.
- tools/train_with_tensorboard.sh end to end: a short demo run, then
  TensorBoard's HTTP API serves its scalars until Enter is pressed.
"""
import glob
import json
import ntpath
import os
import os.path as osp
import pty
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings

import pytest

from tests.tools.wine_cmd import (MINGW, WineCmd, wine_unavailable,
                                  windows_path)
from tests.utils import (REPO_ROOT, free_port, kill_group, spawn,
                         time_left_in_test)

# the scripts do not depend on the stack: run at one end (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.one_end]
needs_wine = pytest.mark.skipif(wine_unavailable() is not None,
                                reason=str(wine_unavailable()))

STUB_C = osp.join(osp.dirname(osp.abspath(__file__)), 'launcher_stub.c')
BROWSER = '#!/bin/sh\nprintf "%s\\n" "$*" >> "$MMSAFE_STUB_BROWSER"\n'
# Stand-in for .venv\Scripts\activate.bat: records the console code page
# that the launcher set, then puts the venv first on PATH as venv does.
ACTIVATE = ('@echo off\r\n'
            'for /f "delims=" %%c in (\'chcp\') do set '
            '"MMSAFE_STUB_CODEPAGE=%%c"\r\n'
            'set "VIRTUAL_ENV=%~dp0.."\r\n'
            'set "PATH=%~dp0;%PATH%"\r\n')


@pytest.fixture(scope='module')
def wine():
    cmd = WineCmd()
    try:
        stub = osp.join(cmd.root, 'launcher_stub.exe')
        subprocess.run([shutil.which(MINGW), '-O1', '-s',
                        '-Wall', '-Werror', '-o', stub, STUB_C], check=True,
                       timeout=120)
        cmd.stub = stub
        yield cmd
    finally:
        cmd.close()


#: wine's cmd when it could not start a program: the command's first token
_NOT_STARTED = re.compile(
    r"'\"?(Z:\\[^\"]+?\.exe)\"?[^']*' is not recognized as an internal "
    r'or external command')


class Sandbox:
    """A copy of the repository's batch files with stand-in programs."""

    def __init__(self, root: str, wine: WineCmd):
        self.root = root
        self.wine = wine
        self.record = osp.join(root, 'record.jsonl')
        self.stubs = osp.join(root, 'stubs')
        self.repo = osp.join(root, 'repo')
        os.makedirs(osp.join(self.repo, 'tools'))
        os.makedirs(self.stubs)
        for name in ('train_with_tensorboard.bat', 'setup_env.bat',
                     'setup_plan.py'):
            shutil.copy2(osp.join(REPO_ROOT, 'tools', name),
                         osp.join(self.repo, 'tools', name))
        for name in ('python.exe', 'powershell.exe'):
            shutil.copy2(wine.stub, osp.join(self.stubs, name))
        self.browser_record = osp.join(root, 'browser.txt')
        # Built mmcv wheels are kept here, not in the wine prefix's
        # %LOCALAPPDATA% that the tests share.
        self.cache = osp.join(root, 'cache')
        with open(osp.join(self.stubs, 'browser'), 'w') as f:
            f.write(BROWSER)
        os.chmod(osp.join(self.stubs, 'browser'), 0o755)
        with open(osp.join(self.stubs, 'activate.bat'), 'w',
                  newline='') as f:
            f.write(ACTIVATE)
        wine.set_browser(osp.join(self.stubs, 'browser'))

    def make_venv(self, *installed: str) -> None:
        scripts = osp.join(self.repo, '.venv', 'Scripts')
        os.makedirs(scripts)
        shutil.copy2(osp.join(self.stubs, 'python.exe'), scripts)
        shutil.copy2(osp.join(self.stubs, 'activate.bat'), scripts)
        for module in installed:
            open(osp.join(self.repo, '.venv', f'installed-{module}'),
                 'w').close()

    def calls(self, name=None):
        if not osp.exists(self.record):
            return []
        with open(self.record, encoding='utf-8') as f:
            lines = f.read().split('\n')
        # The last piece has no newline yet: empty, or a line that a
        # stand-in started while the tests poll is being written now.
        calls = [json.loads(line) for line in lines[:-1]]
        return [c for c in calls if name is None or c['name'] == name]

    def browser_urls(self):
        if not osp.exists(self.browser_record):
            return []
        with open(self.browser_record) as f:
            return f.read().split()

    def run(self, bat: str, *args: str, env=None, until=None):
        """Run ``bat`` once; again from the same start, once, when wine's
        cmd failed to start a program that exists (seen under load: "'<an
        existing python.exe> ...' is not recognized as an internal or
        external command"; the batch file cannot cause that)."""
        before = tempfile.mkdtemp(prefix='sandbox-', dir=osp.dirname(
            self.root))
        snapshot = osp.join(before, 'root')
        shutil.copytree(self.root, snapshot, symlinks=True)
        try:
            result = self._run_once(bat, args, env, until)
            missing = _NOT_STARTED.search(result.flat)
            if result.returncode != 0 and missing and osp.exists(
                    missing.group(1)[2:].replace('\\', '/')):
                warnings.warn(f'wine did not start {missing.group(1)}, '
                              f'which exists: running {bat} again')
                shutil.rmtree(self.root)
                shutil.copytree(snapshot, self.root, symlinks=True)
                result = self._run_once(bat, args, env, until)
            return result
        finally:
            shutil.rmtree(before, ignore_errors=True)

    def _run_once(self, bat, args, env, until):
        return self.wine.run(
            [windows_path(osp.join(self.repo, 'tools', bat)), *args],
            cwd=self.root, path_first=[self.stubs],
            env=dict(MMSAFE_STUB_RECORD=windows_path(self.record),
                     MMSAFE_STUB_DIR=windows_path(self.stubs),
                     MMSAFE_STUB_BROWSER=self.browser_record,
                     MMSAFE_CACHE_DIR=windows_path(self.cache),
                     **(env or {})),
            until=until)

    def tensorboard_and_browser_started(self):
        return bool(self.browser_urls()) and any(
            c['args'][:2] == ['-m', 'tensorboard.main']
            for c in self.calls('python'))

    def path(self, *parts):
        """``repo/parts`` as the stand-ins see it (a Windows path)."""
        return ntpath.normpath(windows_path(osp.join(self.repo, *parts)))


def same_path(a, b):
    return ntpath.normcase(ntpath.normpath(a)) == ntpath.normcase(
        ntpath.normpath(b))


@pytest.fixture
def sandbox(tmp_path, wine):
    return Sandbox(str(tmp_path), wine)


def train_calls(box):
    return [c for c in box.calls('python') if c['args'][:1] == [
        'tools\\train.py']]


def tensorboard_calls(box):
    return [c['args'][2:] for c in box.calls('python')
            if c['args'][:2] == ['-m', 'tensorboard.main']]


@needs_wine
@pytest.mark.timeout(300)
def test_default_config_port_and_work_dir(sandbox):
    sandbox.make_venv('torch', 'mmcv', 'mmsafe')
    result = sandbox.run('train_with_tensorboard.bat',
                         until=sandbox.tensorboard_and_browser_started)
    assert result.returncode == 0, result
    (train,) = train_calls(sandbox)
    assert train['args'] == ['tools\\train.py', 'configs\\llvip\\demo_cpu.py',
                             '--work-dir', 'work_dirs\\demo_cpu']
    # Training runs from the repository root, with the venv's python, in a
    # UTF-8 console (code page 65001) and UTF-8 Python I/O.
    assert same_path(train['cwd'], sandbox.path()), train
    assert same_path(train['exe'],
                     sandbox.path('.venv', 'Scripts', 'python.exe')), train
    assert train['env']['MMSAFE_STUB_CODEPAGE'].endswith('65001'), train
    assert train['env']['PYTHONUTF8'] == '1'
    assert train['env']['PYTHONIOENCODING'] == 'utf-8'
    assert osp.isdir(osp.join(sandbox.repo, 'work_dirs', 'demo_cpu'))
    assert tensorboard_calls(sandbox) == [
        ['--logdir', 'work_dirs\\demo_cpu', '--port', '6006']]
    assert sandbox.browser_urls() == ['http://localhost:6006/']
    # A ready venv: no set-up, no failure path.
    assert not any(c['args'][:2] == ['-m', 'venv']
                   for c in sandbox.calls('python'))
    assert 'FAILED' not in result.flat
    assert 'training finished' in result.flat


@needs_wine
@pytest.mark.timeout(300)
def test_explicit_arguments_and_train_py_pass_through(sandbox):
    sandbox.make_venv('torch', 'mmcv', 'mmsafe')
    result = sandbox.run(
        'train_with_tensorboard.bat', 'configs\\llvip\\my_run.py', '6123',
        'work_dirs\\run 1', '--resume', '--amp', '--cfg-options',
        'train_cfg.max_epochs=2', 'optim_wrapper.optimizer.lr=0.01',
        until=sandbox.tensorboard_and_browser_started)
    assert result.returncode == 0, result
    (train,) = train_calls(sandbox)
    assert train['args'] == [
        'tools\\train.py', 'configs\\llvip\\my_run.py', '--work-dir',
        'work_dirs\\run 1', '--resume', '--amp', '--cfg-options',
        'train_cfg.max_epochs=2', 'optim_wrapper.optimizer.lr=0.01']
    assert tensorboard_calls(sandbox) == [
        ['--logdir', 'work_dirs\\run 1', '--port', '6123']]
    assert sandbox.browser_urls() == ['http://localhost:6123/']


@needs_wine
@pytest.mark.timeout(300)
def test_empty_arguments_keep_defaults_and_work_dir_follows_config(sandbox):
    sandbox.make_venv('torch', 'mmcv', 'mmsafe')
    result = sandbox.run('train_with_tensorboard.bat', 'configs\\x\\my_run.py',
                         '', '', '--resume',
                         until=sandbox.tensorboard_and_browser_started)
    assert result.returncode == 0, result
    (train,) = train_calls(sandbox)
    assert train['args'] == ['tools\\train.py', 'configs\\x\\my_run.py',
                             '--work-dir', 'work_dirs\\my_run', '--resume']
    assert tensorboard_calls(sandbox) == [
        ['--logdir', 'work_dirs\\my_run', '--port', '6006']]


@needs_wine
@pytest.mark.timeout(300)
def test_missing_venv_runs_setup_first(sandbox):
    result = sandbox.run('train_with_tensorboard.bat',
                         until=sandbox.tensorboard_and_browser_started)
    assert result.returncode == 0, result
    assert '.venv not found: running tools\\setup_env.bat first' in \
        result.output
    calls = sandbox.calls('python')
    assert calls[0]['args'][:2] == ['-m', 'venv']
    assert same_path(calls[0]['args'][2], sandbox.path('.venv'))
    (train,) = train_calls(sandbox)
    # The set-up's venv trains, activated in the launcher's UTF-8 console.
    assert same_path(train['exe'],
                     sandbox.path('.venv', 'Scripts', 'python.exe')), train
    assert train['env']['MMSAFE_STUB_CODEPAGE'].endswith('65001'), train
    assert calls.index(train) > max(
        i for i, c in enumerate(calls) if c['args'][:3] == [
            '-m', 'pip', 'install'])


@needs_wine
@pytest.mark.timeout(300)
def test_training_failure_shows_log_tail_and_exits_1(sandbox):
    sandbox.make_venv('torch', 'mmcv', 'mmsafe')
    result = sandbox.run('train_with_tensorboard.bat', '', '',
                         'work_dirs\\bad',
                         env=dict(MMSAFE_STUB_TRAIN_RC='3'),
                         until=sandbox.tensorboard_and_browser_started)
    assert result.returncode == 1, result
    assert 'training FAILED. Last lines of the newest log:' in result.flat
    # The last 40 lines of the newest log, nothing before them.
    assert 'log line 60' in result.flat and 'log line 21' in result.flat
    # (no "log line 2xx" exists, so this names line 20 alone)
    assert 'log line 20' not in result.flat
    (ps,) = sandbox.calls('powershell')
    assert "-Path 'work_dirs\\bad'" in ps['args'][-1]
    assert 'training finished' not in result.flat


# --- tools/setup_env.bat ----------------------------------------------------
# The stand-in answers tools\setup_plan.py with fixed plans (see
# launcher_stub.c): by default torch 2.1.2 from PyTorch's CPU index, then
# OpenMMLab's cpu/torch2.1 mmcv index and a wheel folder for that build.

CPU_INDEX = 'https://download.pytorch.org/whl/cpu'
MMCV_CPU_INDEX = ('https://download.openmmlab.com/mmcv/dist/cpu/torch2.1/'
                  'index.html')
WHEEL_DIR = ('wheels', 'mmcv-2.1.0', 'torch2.1.2-cpuops-cp311')
WHEEL = 'mmcv-2.1.0-cp311-cp311-win_amd64.whl'
PIP_C = ['-m', 'pip', 'install', '-c', '<constraints>']
STACK = ['mmengine==0.10.7', 'mmdet==3.3.0', 'tensorboard', 'pytest',
         'pytest-timeout', 'pytest-xdist', 'psutil']
NUMPY1_CONSTRAINTS = ['numpy<2', 'opencv-python<4.11',
                      'opencv-python-headless<4.11']


def setup_steps(box):
    """The stand-in python's calls, with the set-up's paths as
    ``<venv>``, ``<repo>``, ``<constraints>``, ``<wheels>``, the planner's
    calls as ``['plan', what]`` and the ``-c`` checks of mmcv and the final
    report shortened."""
    names = {'<constraints>': box.path('.venv', 'mmsafe-constraints.txt'),
             '<wheels>': windows_path(osp.join(box.cache, *WHEEL_DIR)),
             f'<wheels>\\{WHEEL}': windows_path(
                 osp.join(box.cache, *WHEEL_DIR, WHEEL)),
             '<venv>': box.path('.venv'), '<repo>': box.path()}

    def name(arg):
        return next((n for n, p in names.items() if same_path(arg, p)), arg)

    steps = []
    for call in box.calls('python'):
        args = call['args']
        if args and args[0].lower().endswith('setup_plan.py'):
            assert same_path(args[0], box.path('tools', 'setup_plan.py'))
            steps.append(['plan', *args[1:]])
        elif args[:1] == ['-c'] and 'print(' in args[1]:
            steps.append(['-c', 'report'])
        elif args[:1] == ['-c'] and 'mmcv.ops' in args[1]:
            steps.append(['-c', 'mmcv ops'])
        else:
            steps.append([name(a) for a in args])
    return steps


def constraints(box):
    with open(osp.join(box.repo, '.venv', 'mmsafe-constraints.txt')) as f:
        return f.read().splitlines()


@needs_wine
@pytest.mark.timeout(300)
def test_setup_env_fresh_install_order(sandbox):
    result = sandbox.run('setup_env.bat')
    assert result.returncode == 0, result
    assert setup_steps(sandbox) == [
        ['-m', 'venv', '<venv>'],
        ['-c', 'import mmsafe'],
        # torch as the planner says
        ['-c', 'import torch'],
        ['plan', 'torch'],
        ['-m', 'pip', 'install', '--extra-index-url', CPU_INDEX,
         'torch==2.1.2'],
        # numpy, which this torch can use: no pins needed
        ['plan', 'numpy-pin'],
        PIP_C + ['numpy'],
        ['plan', 'numpy'],
        # mmcv, after mmengine (which mmcv imports): the planner's
        # prebuilt index, which has a working wheel
        PIP_C + ['mmengine==0.10.7'],
        ['-c', 'mmcv ops'],
        PIP_C + ['setuptools<70', 'wheel', 'ninja', 'packaging'],
        ['plan', 'mmcv'],
        PIP_C + ['--only-binary=mmcv', '--no-deps', '--timeout', '10',
                 '--retries', '0', '-f', MMCV_CPU_INDEX, 'mmcv==2.1.0'],
        ['-c', 'mmcv ops'],
        PIP_C + STACK,
        ['-m', 'pip', 'install', '--no-deps', '--no-build-isolation', '-e',
         '<repo>'],
        ['plan', 'numpy'],
        ['-c', 'report']]
    assert constraints(sandbox) == []
    assert ('[setup_env] installing "torch==2.1.2" (extra index '
            f'{CPU_INDEX})') in result.flat
    assert "installed OpenMMLab's prebuilt mmcv wheel" in result.flat
    assert '[setup_env] ok:' in result.flat
    assert not osp.exists(osp.join(sandbox.cache, *WHEEL_DIR))
    # Run again on the ready environment: it only verifies.
    os.remove(sandbox.record)
    again = sandbox.run('setup_env.bat')
    assert again.returncode == 0, again
    assert 'environment ready' in again.flat
    assert [c['args'] for c in sandbox.calls('python')] == [
        ['-c', 'import mmsafe']]


@needs_wine
@pytest.mark.timeout(300)
def test_setup_env_source_build_and_failure(sandbox):
    result = sandbox.run('setup_env.bat', env=dict(
        MMSAFE_MMCV_INDEX='none', MMSAFE_STUB_FAIL='mmdet==3.3.0'))
    assert result.returncode == 1, result
    assert '[setup_env] FAILED, see the messages above.' in result.flat
    steps = setup_steps(sandbox)
    # the set-up got as far as the build (not stopped by an earlier step)
    assert ['plan', 'mmcv'] in steps, (steps, result)
    # No prebuilt attempt: a wheel built without pip's cache (which keys it
    # by its source, whatever torch it was built against) in the folder for
    # this torch build, then installed from there.
    assert steps[steps.index(['plan', 'mmcv']) + 1:] == [
        ['-m', 'pip', 'wheel', '-c', '<constraints>', '--no-deps',
         '--no-build-isolation', '--no-cache-dir', '-w', '<wheels>',
         'mmcv==2.1.0'],
        PIP_C + ['--no-deps', '--force-reinstall', f'<wheels>\\{WHEEL}'],
        ['-c', 'mmcv ops'],
        # Nothing is installed after the failing step.
        PIP_C + STACK]
    (build,) = [c for c in sandbox.calls('python')
                if c['args'][:3] == ['-m', 'pip', 'wheel']]
    assert build['env']['MMCV_WITH_OPS'] == '1'
    assert build['env']['MAX_JOBS'].isdigit(), build
    assert osp.isfile(osp.join(sandbox.cache, *WHEEL_DIR, WHEEL))
    assert 'building mmcv==2.1.0 with ops from source' in result.flat
    assert 'prebuilt' not in result.flat


@needs_wine
@pytest.mark.timeout(300)
def test_setup_env_torch_built_against_numpy_1(sandbox):
    result = sandbox.run('setup_env.bat', env=dict(MMSAFE_STUB_NUMPY1='1'))
    assert result.returncode == 0, result
    assert ('[setup_env] this torch was built against numpy 1.x: keeping '
            'numpy<2 and opencv<4.11 for every install') in result.flat
    assert constraints(sandbox) == NUMPY1_CONSTRAINTS
    steps = setup_steps(sandbox)
    at = steps.index(['plan', 'numpy-pin'])
    assert steps[at:at + 4] == [
        ['plan', 'numpy-pin'],
        PIP_C + ['numpy'],  # held below 2 by the pins
        ['plan', 'numpy'],  # which torch can use
        PIP_C + ['mmengine==0.10.7']]
    # Every install after torch's is held by the constraints, mmsafe's own
    # (--no-deps) aside.
    installs = [s for s in steps[at:] if s[:3] == ['-m', 'pip', 'install']]
    assert [s[3:5] for s in installs] == [['-c', '<constraints>']] * 5 + [
        ['--no-deps', '--no-build-isolation']]
    assert PIP_C + STACK in installs
    assert '[setup_env] ok:' in result.flat


PY312_NOTE = ('Python 3.12 has no torch 2.1.2 wheel (those stop at Python '
              '3.11): taking torch 2.2.2, the oldest release with one. '
              'OpenMMLab publishes no prebuilt mmcv for it, so mmcv is built '
              'from source; use Python 3.8-3.11 for the prebuilt stack')
MMCV_NOTE = ('no prebuilt mmcv 2.1.0 for torch 2.2.2 at https://download.'
             'openmmlab.com/mmcv/dist/cpu/torch2.2/index.html (OpenMMLab '
             'publishes them for torch 2.1 and older), or it is not reachable')


@needs_wine
@pytest.mark.timeout(300)
def test_setup_env_prints_plan_notes_and_reuses_a_built_wheel(sandbox):
    # A second set-up for the same torch build (Python 3.12: torch 2.2.2 from
    # PyPI, no prebuilt mmcv), with the wheel that the first one built.
    os.makedirs(osp.join(sandbox.cache, *WHEEL_DIR))
    open(osp.join(sandbox.cache, *WHEEL_DIR, WHEEL), 'w').close()
    result = sandbox.run('setup_env.bat', env=dict(
        MMSAFE_STUB_PLAN_TORCH_REQ='torch==2.2.2',
        MMSAFE_STUB_PLAN_TORCH_INDEX='none',
        MMSAFE_STUB_PLAN_TORCH_NOTE=PY312_NOTE,
        MMSAFE_STUB_PLAN_MMCV_INDEX='none',
        MMSAFE_STUB_PLAN_MMCV_NOTE=MMCV_NOTE))
    assert result.returncode == 0, result
    assert f'[setup_env] {PY312_NOTE}' in result.flat
    assert f'[setup_env] {MMCV_NOTE}' in result.flat
    assert '[setup_env] reusing the mmcv wheel built earlier' in result.flat
    steps = setup_steps(sandbox)
    at = steps.index(['plan', 'torch'])
    assert steps[at + 1] == ['-m', 'pip', 'install', 'torch==2.2.2']
    assert steps[steps.index(['plan', 'mmcv']) + 1:][:3] == [
        PIP_C + ['--no-deps', '--force-reinstall', f'<wheels>\\{WHEEL}'],
        ['-c', 'mmcv ops'],
        PIP_C + STACK]
    assert not any(s[:3] == ['-m', 'pip', 'wheel'] for s in steps)


@needs_wine
@pytest.mark.timeout(300)
def test_setup_env_rebuilds_a_kept_wheel_that_does_not_work(sandbox):
    # (the stand-in's stand-in for a wheel built against another torch: a
    # file that is not empty, which installs no working mmcv)
    os.makedirs(osp.join(sandbox.cache, *WHEEL_DIR))
    with open(osp.join(sandbox.cache, *WHEEL_DIR, WHEEL), 'w') as f:
        f.write('built against another torch')
    result = sandbox.run('setup_env.bat', env=dict(MMSAFE_MMCV_INDEX='none'))
    assert result.returncode == 0, result
    assert 'that wheel does not work with this torch: building again' in \
        result.flat
    steps = setup_steps(sandbox)
    reinstall = PIP_C + ['--no-deps', '--force-reinstall',
                         f'<wheels>\\{WHEEL}']
    assert steps[steps.index(['plan', 'mmcv']) + 1:][:6] == [
        reinstall, ['-c', 'mmcv ops'],
        ['-m', 'pip', 'wheel', '-c', '<constraints>', '--no-deps',
         '--no-build-isolation', '--no-cache-dir', '-w', '<wheels>',
         'mmcv==2.1.0'],
        reinstall, ['-c', 'mmcv ops'],
        PIP_C + STACK]
    assert os.path.getsize(osp.join(sandbox.cache, *WHEEL_DIR, WHEEL)) == 0


@needs_wine
@pytest.mark.timeout(300)
def test_setup_env_user_torch_passes_through_the_planner(sandbox):
    index = 'https://download.pytorch.org/whl/cu118'
    result = sandbox.run('setup_env.bat', env=dict(
        MMSAFE_TORCH='torch==2.3.1', MMSAFE_TORCH_INDEX=index))
    assert result.returncode == 0, result
    steps = setup_steps(sandbox)
    assert steps[2:5] == [
        ['-c', 'import torch'], ['plan', 'torch'],
        ['-m', 'pip', 'install', '--extra-index-url', index, 'torch==2.3.1']]
    assert sum('torch==2.3.1' in s for s in steps) == 1
    assert ('[setup_env] installing "torch==2.3.1" (extra index '
            f'{index})') in result.flat


# --- tools/train_with_tensorboard.sh with a real TensorBoard ---------------

def _get_json(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read().decode('utf-8'))


def _scalar_tags(port):
    """{run: [tags]} that TensorBoard serves, {} while it is not up."""
    try:
        tags = _get_json(f'http://127.0.0.1:{port}/data/plugin/scalars/tags')
    except (urllib.error.URLError, ConnectionError, OSError):
        return {}
    return {run: sorted(run_tags) for run, run_tags in tags.items()}


@pytest.mark.timeout(600)
def test_linux_launcher_trains_and_tensorboard_serves_the_run(tmp_path):
    from tests.tools.test_train_cli import DEMO, shrink
    port = free_port()
    work_dir = str(tmp_path / 'work')
    launcher = osp.join(REPO_ROOT, 'tools', 'train_with_tensorboard.sh')
    env = dict(os.environ, MMSAFE_NO_BROWSER='1', PYTHON=sys.executable,
               PYTHONPATH=REPO_ROOT)
    master, slave = pty.openpty()  # a terminal: the launcher waits for Enter
    try:
        proc = spawn(
            ['bash', launcher, DEMO, str(port), work_dir, '--cfg-options',
             *shrink(str(tmp_path / 'llvip') + '/'),
             'train_cfg.val_interval=1', 'default_hooks.logger.interval=1'],
            cwd=REPO_ROOT, env=env, stdin=slave, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
    finally:
        os.close(slave)
    output = []
    reader = threading.Thread(
        # Raw reads: the launcher's prompt ends without a newline.
        target=lambda: output.extend(
            iter(lambda: os.read(proc.stdout.fileno(), 65536), b'')),
        daemon=True)
    reader.start()
    text = lambda: b''.join(output).decode('utf-8', 'replace')  # noqa: E731
    deadline = time.monotonic() + time_left_in_test(540)
    wanted = {'train/loss_macl', 'val/pascal_voc/mAP'}
    try:
        # Training ends, then the launcher keeps TensorBoard up.
        while ('press Enter to stop it' not in text()
               and proc.poll() is None and time.monotonic() < deadline):
            time.sleep(0.5)
        assert 'press Enter to stop it' in text(), text()[-6000:]
        assert osp.exists(osp.join(work_dir, 'epoch_1.pth')), text()[-6000:]
        # TensorBoard (re)loads the event files in the work dir.
        served = {}
        while time.monotonic() < deadline:
            served = _scalar_tags(port)
            if any(wanted <= set(tags) for tags in served.values()):
                break
            time.sleep(1)
        runs = [run for run, tags in served.items() if wanted <= set(tags)]
        assert runs, (served, text()[-4000:])
        (run,) = runs
        event_dirs = glob.glob(osp.join(work_dir, '*', 'vis_data'))
        assert [osp.relpath(d, work_dir) for d in event_dirs] == [run]
        for tag in sorted(wanted):
            query = urllib.parse.urlencode(dict(run=run, tag=tag))
            points = _get_json(f'http://127.0.0.1:{port}/data/plugin/scalars/'
                               f'scalars?{query}')
            assert points, tag
            values = [value for _, _, value in points]
            assert all(v == v and abs(v) < float('inf') for v in values), (
                tag, points)
            if tag == 'train/loss_macl':
                assert min(values) > 0, points
            else:  # one validation per epoch, one epoch
                assert len(points) == 1 and 0 <= values[0] <= 1, points
        # Enter stops TensorBoard and ends the launcher with training's code.
        os.write(master, b'\n')
        proc.wait(timeout=max(1, deadline - time.monotonic()))
        assert proc.returncode == 0, text()[-6000:]
        assert _scalar_tags(port) == {}, 'TensorBoard still serving'
    finally:
        kill_group(proc.pid)
        proc.wait()
        reader.join(timeout=10)
        os.close(master)


@needs_wine
@pytest.mark.timeout(300)
def test_setup_env_stops_where_mmcv_cannot_be_built(sandbox):
    """A torch whose headers need C++20 (mmcv 2.1.0 compiles as C++17)
    and no prebuilt wheel: the planner's reason, no build attempted."""
    reason = ('torch 2.15.0 needs C++20 for extensions and mmcv 2.1.0 '
              'compiles its ops as C++17: mmcv cannot be built for this '
              'torch. Use torch 2.13 or older (MMSAFE_TORCH=torch==2.1.2, '
              'the default, with mmcv 2.1.0), or a prebuilt mmcv wheel '
              '(MMSAFE_MMCV_INDEX)')
    result = sandbox.run('setup_env.bat', env=dict(
        MMSAFE_MMCV_INDEX='none', MMSAFE_STUB_PLAN_MMCV_BUILD=reason))
    assert result.returncode == 1, result
    assert f'[setup_env] {reason}' in result.flat
    assert 'no mmcv wheel for this torch and no way to build one' in \
        result.flat
    assert not any(c['args'][:3] == ['-m', 'pip', 'wheel']
                   for c in sandbox.calls('python'))


@pytest.mark.timeout(120)
def test_linux_launcher_takes_the_venv_only_once_its_set_up_finished(
        tmp_path):
    """A ``.venv`` whose set-up stopped (e.g. before torch) is not used:
    ``python3`` is, and the launcher says why; ``PYTHON`` wins over both."""
    repo = tmp_path / 'repo'
    (repo / 'tools').mkdir(parents=True)
    shutil.copy(osp.join(REPO_ROOT, 'tools', 'train_with_tensorboard.sh'),
                repo / 'tools')
    record = tmp_path / 'used.txt'
    bins = tmp_path / 'bin'
    bins.mkdir()
    for path, name in ((repo / '.venv' / 'bin' / 'python', 'venv'),
                       (bins / 'python3', 'python3'),
                       (bins / 'chosen', 'PYTHON')):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'#!/bin/sh\necho {name} "$@" >> {str(record)!r}\n'
                        'exit 1\n')
        path.chmod(0o755)

    def used(**env):
        if record.exists():
            record.unlink()
        result = subprocess.run(
            ['bash', str(repo / 'tools' / 'train_with_tensorboard.sh'),
             'cfg.py', str(free_port()), str(tmp_path / 'work')],
            env=dict(PATH=f'{bins}{os.pathsep}/usr/bin:/bin', HOME=str(
                tmp_path), MMSAFE_NO_BROWSER='1', **env),
            stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=60)
        lines = record.read_text().splitlines()
        trained = [ln.split()[0] for ln in lines if 'tools/train.py' in ln]
        return trained, result.stdout

    trained, out = used()
    assert trained == ['python3'], out
    assert ".venv's set-up has not finished" in out
    (repo / '.venv' / '.mmsafe-setup').write_text('ready\n')
    trained, out = used()
    assert trained == ['venv'], out
    assert 'has not finished' not in out
    trained, _ = used(PYTHON=str(bins / 'chosen'))
    assert trained == ['PYTHON']


def test_a_program_wine_did_not_start_is_run_again_from_the_same_start(
        tmp_path):
    """The sandbox's one retry: only for wine's failure to start a program
    that exists, from the files as they were before the first run."""
    from tests.tools.wine_cmd import WineResult

    class FakeWine:
        stub = str(tmp_path / 'stub.exe')

        def __init__(self, results):
            self.results = list(results)
            self.seen = []

        def set_browser(self, path):
            pass

        def run(self, cmdline, cwd, path_first, env, until):
            # what the first run leaves behind must be gone at the second
            self.seen.append(osp.exists(osp.join(cwd, 'left_by_a_run')))
            open(osp.join(cwd, 'left_by_a_run'), 'w').close()
            return self.results.pop(0)

    open(FakeWine.stub, 'w').close()
    exe = windows_path(str(tmp_path / 'box' / 'stubs' / 'python.exe'))
    not_started = WineResult(1, f"'\"{exe}\" x.py plan ' is not recognized"
                             ' as an internal or external command', False)
    ok = WineResult(0, 'done', False)
    (tmp_path / 'box').mkdir()
    wine = FakeWine([not_started, ok])
    box = Sandbox(str(tmp_path / 'box'), wine)
    with pytest.warns(UserWarning, match='wine did not start'):
        assert box.run('setup_env.bat') is ok
    assert wine.seen == [False, False]
    # a program that does not exist, or another failure: no second run
    gone = WineResult(1, not_started.output.replace('python.exe', 'no.exe'),
                      False)
    for first in (gone, WineResult(1, 'FAILED', False)):
        shutil.rmtree(tmp_path / 'box')
        (tmp_path / 'box').mkdir()
        wine = FakeWine([first, ok])
        assert Sandbox(str(tmp_path / 'box'), wine).run(
            'setup_env.bat') is first
        assert len(wine.seen) == 1

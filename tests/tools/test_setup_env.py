"""tools/setup_env.sh's mmcv step, run for real against a stand-in venv.

The venv's ``python`` is a small script: pip calls are recorded and do
nothing, the check that mmcv's ops work fails (no mmcv), everything else
(the planner, ``import torch``) goes to this test's interpreter. Nothing is
downloaded or compiled.
"""
import os
import os.path as osp
import stat
import sys

import pytest

from tests.utils import REPO_ROOT, run_command

pytestmark = [pytest.mark.one_end, pytest.mark.slow]

SETUP_ENV = osp.join(REPO_ROOT, 'tools', 'setup_env.sh')


def _standin_venv(tmp_path, torch_installed=True):
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True)
    record = tmp_path / 'calls.txt'
    python = venv / 'bin' / 'python'
    no_torch = '' if torch_installed else \
        'if [ "$1" = -c ] && [ "$2" = "import torch" ]; then exit 1; fi'
    python.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {str(record)!r}
if [ "$1" = -m ] && [ "$4" = wheel ]; then
  echo "env CFLAGS=${{CFLAGS-<unset>}}" >> {str(record)!r}
fi
if [ "$1" = -m ] && [ "$2" = pip ]; then exit 0; fi
{no_torch}
if [ "$1" = -c ] && [[ "$2" == *"from mmcv.ops import nms"* ]]; then exit 1; fi
exec {sys.executable!r} "$@"
""")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return venv, record


def _builds(calls):
    """The recorded ``pip wheel`` calls (pip's subcommand after its one
    option), not an install that names the ``wheel`` package."""
    return [c for c in calls
            if c.startswith('-m pip') and c.split()[3:4] == ['wheel']]


def _run_setup(tmp_path, torch_installed=True, **env):
    venv, record = _standin_venv(tmp_path, torch_installed)
    full_env = dict(MMSAFE_VENV=str(venv), MMSAFE_PYTHON=sys.executable,
                    MMSAFE_CACHE_DIR=str(tmp_path / 'cache'),
                    MMSAFE_MMCV_INDEX='none', MMSAFE_STACK='default')
    full_env.update(env)
    result = run_command(['bash', SETUP_ENV], timeout=120, env=full_env)
    calls = record.read_text().splitlines() if record.exists() else []
    return result, calls


def test_never_stops_before_compiling_mmcv_with_status_3(tmp_path):
    result, calls = _run_setup(tmp_path, MMSAFE_MMCV_BUILD='never')
    assert result.returncode == 3, result.output
    assert 'MMSAFE_MMCV_BUILD=never: not compiling it' in result.output
    assert _builds(calls) == [], calls
    assert 'pip --disable-pip-version-check install' in ' '.join(calls)
    assert not osp.exists(osp.join(tmp_path, 'venv', '.mmsafe-setup'))


def test_auto_compiles_mmcv_when_no_wheel_fits(tmp_path, monkeypatch):
    monkeypatch.delenv('CFLAGS', raising=False)
    result, calls = _run_setup(tmp_path)
    # the stand-in pip builds nothing, so the final ops check fails: what
    # matters is that the build was asked for, with torch's own headers
    assert result.returncode not in (0, 3), result.output
    assert 'building mmcv==' in result.output
    builds = _builds(calls)
    assert len(builds) == 1, calls
    assert '--no-build-isolation' in builds[0]
    # compiled without debug information (Python's flags ask for -g)
    assert calls[calls.index(builds[0]) + 1] == 'env CFLAGS=-g0', calls
    assert os.path.isdir(osp.join(tmp_path, 'cache'))


def _torch_installs(calls):
    return [c for c in calls
            if c.startswith('-m pip') and 'install' in c.split()
            and any(a.startswith('torch==') for a in c.split())]


def test_never_stops_before_downloading_torch_when_no_wheel_can_fit(
        tmp_path):
    result, calls = _run_setup(
        tmp_path, torch_installed=False, MMSAFE_MMCV_BUILD='never',
        MMSAFE_TORCH='torch==2.1.2', MMSAFE_TORCH_INDEX='none')
    assert result.returncode == 3, result.output
    assert "stopping before torch's download" in result.output
    assert _torch_installs(calls) == [], calls


def test_never_still_installs_torch_when_a_built_wheel_waits(tmp_path):
    py = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    built = tmp_path / 'cache' / 'wheels' / 'mmcv-2.1.0' / \
        f'torch2.1.2+cpu-cpuops-{py}'
    built.mkdir(parents=True)
    (built / f'mmcv-2.1.0-{py}-{py}-linux_x86_64.whl').write_bytes(b'')
    result, calls = _run_setup(
        tmp_path, torch_installed=False, MMSAFE_MMCV_BUILD='never',
        MMSAFE_TORCH='torch==2.1.2', MMSAFE_TORCH_INDEX='none')
    assert "stopping before torch's download" not in result.output
    assert len(_torch_installs(calls)) == 1, calls


def test_a_users_own_cflags_reach_the_mmcv_build(tmp_path):
    result, calls = _run_setup(tmp_path, CFLAGS='-O1 -g')
    builds = _builds(calls)
    assert len(builds) == 1, calls
    assert calls[calls.index(builds[0]) + 1] == 'env CFLAGS=-O1 -g', calls

@echo off
rem Create (or reuse) .venv and install mmsafe's stack on Windows, in order:
rem torch -> mmcv (prebuilt wheel if one exists, else a source build with ops,
rem which needs Visual Studio Build Tools) -> mmengine, mmdet, tensorboard,
rem test tools -> mmsafe (editable). On a ready environment it only verifies.
rem Variables: MMSAFE_VENV, MMSAFE_PYTHON, MMSAFE_TORCH, MMSAFE_TORCH_INDEX,
rem MMSAFE_MMCV_INDEX, MMSAFE_FORCE (same meaning as in tools/setup_env.sh).
rem Sequential lines and goto are used instead of parenthesised blocks, so a
rem variable set on one line is visible on the next without delayed expansion;
rem a failed step is caught by "if errorlevel 1" on the next line rather than
rem "||", which some cmd implementations (wine's) run unconditionally.
setlocal EnableExtensions
set "ROOT=%~dp0.."
if "%MMSAFE_VENV%"=="" set "MMSAFE_VENV=%ROOT%\.venv"
if "%MMSAFE_PYTHON%"=="" set "MMSAFE_PYTHON=python"
if "%MMSAFE_TORCH%"=="" set "MMSAFE_TORCH=torch==2.13.0"
set "PY=%MMSAFE_VENV%\Scripts\python.exe"

if exist "%PY%" goto :have_venv
echo [setup_env] creating virtual environment at %MMSAFE_VENV%
"%MMSAFE_PYTHON%" -m venv "%MMSAFE_VENV%"
if errorlevel 1 goto :fail
:have_venv

if not "%MMSAFE_FORCE%"=="" goto :torch
"%PY%" -c "import mmsafe" >nul 2>&1
if errorlevel 1 goto :torch
echo [setup_env] environment ready (%MMSAFE_VENV%), nothing to do
exit /b 0

:torch
"%PY%" -c "import torch" >nul 2>&1
if not errorlevel 1 goto :keep_torch
echo [setup_env] installing %MMSAFE_TORCH%
if "%MMSAFE_TORCH_INDEX%"=="" "%PY%" -m pip install "%MMSAFE_TORCH%"
if "%MMSAFE_TORCH_INDEX%"=="" if errorlevel 1 goto :fail
if not "%MMSAFE_TORCH_INDEX%"=="" "%PY%" -m pip install --extra-index-url "%MMSAFE_TORCH_INDEX%" "%MMSAFE_TORCH%"
if not "%MMSAFE_TORCH_INDEX%"=="" if errorlevel 1 goto :fail
goto :mmcv
:keep_torch
echo [setup_env] keeping installed torch

:mmcv
"%PY%" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '2.1.0'" >nul 2>&1
if not errorlevel 1 goto :stack
"%PY%" -m pip install "setuptools<70" wheel ninja packaging
if errorlevel 1 goto :fail
if not "%MMSAFE_MMCV_INDEX%"=="" goto :have_index
rem The index URL goes through a file: "for /f" would run the command through
rem "cmd /c", whose quote stripping breaks a quoted path followed by quoted code.
"%PY%" -c "import torch; v='.'.join(torch.__version__.split('+')[0].split('.')[:2]); c=torch.version.cuda; print('https://download.openmmlab.com/mmcv/dist/%%s/torch%%s/index.html' %% (('cu'+c.replace('.','')) if c else 'cpu', v))" > "%MMSAFE_VENV%\mmcv_index.txt"
if errorlevel 1 goto :fail
set /p MMSAFE_MMCV_INDEX=<"%MMSAFE_VENV%\mmcv_index.txt"
del "%MMSAFE_VENV%\mmcv_index.txt"
:have_index
if "%MMSAFE_MMCV_INDEX%"=="none" goto :build_mmcv
echo [setup_env] looking for a prebuilt mmcv wheel at %MMSAFE_MMCV_INDEX%
"%PY%" -m pip install --only-binary=mmcv --no-deps --timeout 10 --retries 0 -f "%MMSAFE_MMCV_INDEX%" mmcv==2.1.0 >nul 2>&1
if errorlevel 1 goto :build_mmcv
"%PY%" -c "import mmcv.ops" >nul 2>&1
if not errorlevel 1 goto :stack
:build_mmcv
echo [setup_env] no prebuilt mmcv wheel: building from source with ops (needs Visual Studio Build Tools)
set "MMCV_WITH_OPS=1"
set "MAX_JOBS=%NUMBER_OF_PROCESSORS%"
"%PY%" -m pip install --no-build-isolation mmcv==2.1.0
if errorlevel 1 goto :fail

:stack
"%PY%" -m pip install mmengine==0.10.7 mmdet==3.3.0 tensorboard pytest pytest-timeout pytest-xdist psutil
if errorlevel 1 goto :fail
"%PY%" -m pip install --no-deps --no-build-isolation -e "%ROOT%"
if errorlevel 1 goto :fail
"%PY%" -c "import mmsafe, mmdet, mmcv, torch; print('[setup_env] ok: torch', torch.__version__, 'mmcv', mmcv.__version__, 'mmdet', mmdet.__version__, 'mmsafe', mmsafe.__version__)"
if errorlevel 1 goto :fail
exit /b 0

:fail
echo [setup_env] FAILED, see the messages above.
exit /b 1

@echo off
rem Create (or reuse) .venv and install mmsafe's stack on Windows, in order:
rem torch -> numpy that this torch can use -> mmcv (OpenMMLab's prebuilt wheel
rem if one exists, else a source build with ops, which needs Visual Studio
rem Build Tools, kept per torch build) -> mmengine, mmdet, tensorboard, test
rem tools -> mmsafe (editable). On a ready environment it only verifies.
rem What to install is chosen by tools\setup_plan.py, as in tools/setup_env.sh:
rem by default torch 2.1.2, the stack for which OpenMMLab publishes prebuilt
rem mmcv 2.1.0 (CUDA 12.1 build with an NVIDIA GPU, CPU build otherwise;
rem Python 3.12+ takes the oldest torch that has a wheel for it).
rem Variables: MMSAFE_VENV, MMSAFE_PYTHON, MMSAFE_TORCH, MMSAFE_TORCH_INDEX,
rem MMSAFE_MMCV_INDEX, MMSAFE_GPU, MMSAFE_CACHE_DIR (default
rem %LOCALAPPDATA%\mmsafe), MMSAFE_FORCE (same meaning as in
rem tools/setup_env.sh).
rem Sequential lines and goto are used instead of parenthesised blocks, so a
rem variable set on one line is visible on the next without delayed expansion;
rem a failed step is caught by "if errorlevel 1" on the next line rather than
rem "||", which some cmd implementations (wine's) run unconditionally.
rem The planner's KEY=VALUE lines go through a file: "for /f" over a command
rem would run it through "cmd /c", whose quote stripping breaks a quoted path
rem followed by quoted arguments.
setlocal EnableExtensions
set "ROOT=%~dp0.."
if "%MMSAFE_VENV%"=="" set "MMSAFE_VENV=%ROOT%\.venv"
if "%MMSAFE_PYTHON%"=="" set "MMSAFE_PYTHON=python"
set "PY=%MMSAFE_VENV%\Scripts\python.exe"
set "PLAN=%ROOT%\tools\setup_plan.py"
set "PLAN_OUT=%MMSAFE_VENV%\mmsafe-plan.txt"
set "CONSTRAINTS=%MMSAFE_VENV%\mmsafe-constraints.txt"
set "MMCV_REQ=mmcv==2.1.0"
set "MMCV_OK=import mmcv, mmcv.ops; assert mmcv.__version__ == '2.1.0', mmcv.__version__"

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

rem 1. torch (keep an existing one; the user may have chosen a CUDA build).
:torch
"%PY%" -c "import torch" >nul 2>&1
if not errorlevel 1 goto :keep_torch
"%PY%" "%PLAN%" torch > "%PLAN_OUT%"
if errorlevel 1 goto :fail
set "PLAN_TORCH_REQ="
set "PLAN_TORCH_INDEX="
for /f "usebackq tokens=1,* delims==" %%a in ("%PLAN_OUT%") do set "PLAN_%%a=%%b"
for /f "usebackq tokens=1,* delims==" %%a in ("%PLAN_OUT%") do if "%%a"=="NOTE" if not "%%b"=="" echo [setup_env] %%b
del "%PLAN_OUT%"
if not defined PLAN_TORCH_REQ goto :fail
if not defined PLAN_TORCH_INDEX goto :torch_pypi
echo [setup_env] installing "%PLAN_TORCH_REQ%" (extra index %PLAN_TORCH_INDEX%)
"%PY%" -m pip install --extra-index-url "%PLAN_TORCH_INDEX%" "%PLAN_TORCH_REQ%"
if errorlevel 1 goto :fail
goto :numpy
:torch_pypi
echo [setup_env] installing "%PLAN_TORCH_REQ%"
"%PY%" -m pip install "%PLAN_TORCH_REQ%"
if errorlevel 1 goto :fail
goto :numpy
:keep_torch
echo [setup_env] keeping installed torch

rem 2. numpy that this torch can exchange arrays with. A torch built against
rem numpy 1.x (torch 2.1/2.2) cannot use numpy 2, and opencv >= 4.11 needs
rem numpy 2: both are then held below 2 / 4.11 for every later install.
:numpy
"%PY%" "%PLAN%" numpy-pin > "%CONSTRAINTS%"
if errorlevel 1 goto :fail
for %%s in ("%CONSTRAINTS%") do if %%~zs gtr 0 echo [setup_env] this torch was built against numpy 1.x: keeping numpy^<2 and opencv^<4.11 for every install
"%PY%" -m pip install -c "%CONSTRAINTS%" numpy
if errorlevel 1 goto :fail
"%PY%" "%PLAN%" numpy
if errorlevel 1 goto :fail

rem 3. mmcv with compiled ops that run against THIS torch. mmcv imports
rem mmengine, so mmengine comes first (else every check of mmcv fails).
:mmcv
"%PY%" -m pip install -c "%CONSTRAINTS%" mmengine==0.10.7
if errorlevel 1 goto :fail
"%PY%" -c "%MMCV_OK%" >nul 2>&1
if not errorlevel 1 goto :stack
"%PY%" -m pip install -c "%CONSTRAINTS%" "setuptools<70" wheel ninja packaging
if errorlevel 1 goto :fail
"%PY%" "%PLAN%" mmcv > "%PLAN_OUT%"
if errorlevel 1 goto :fail
set "PLAN_MMCV_INDEX="
set "PLAN_MMCV_WHEEL_DIR="
set "PLAN_MMCV_BUILD="
for /f "usebackq tokens=1,* delims==" %%a in ("%PLAN_OUT%") do set "PLAN_%%a=%%b"
for /f "usebackq tokens=1,* delims==" %%a in ("%PLAN_OUT%") do if "%%a"=="NOTE" if not "%%b"=="" echo [setup_env] %%b
for /f "usebackq tokens=1,* delims==" %%a in ("%PLAN_OUT%") do if "%%a"=="MMCV_BUILD" if not "%%b"=="ok" echo [setup_env] %%b
del "%PLAN_OUT%"
if not defined PLAN_MMCV_INDEX goto :fail
if not defined PLAN_MMCV_WHEEL_DIR goto :fail
if "%PLAN_MMCV_INDEX%"=="none" goto :built_mmcv
echo [setup_env] looking for a prebuilt %MMCV_REQ% wheel at %PLAN_MMCV_INDEX% (short timeouts)
"%PY%" -m pip install -c "%CONSTRAINTS%" --only-binary=mmcv --no-deps --timeout 10 --retries 0 -f "%PLAN_MMCV_INDEX%" %MMCV_REQ% >nul 2>&1
if errorlevel 1 goto :no_wheel
"%PY%" -c "%MMCV_OK%" >nul 2>&1
if errorlevel 1 goto :no_wheel
echo [setup_env] installed OpenMMLab's prebuilt mmcv wheel
goto :stack
:no_wheel
echo [setup_env] no usable prebuilt mmcv wheel there
goto :built_mmcv

rem pip's own cache keys a built wheel by its source, not by the torch it was
rem compiled against: builds are kept per torch build in MMCV_WHEEL_DIR.
:built_mmcv
set "WHEELS=%PLAN_MMCV_WHEEL_DIR%"
set "MMCV_BUILT="
if not exist "%WHEELS%\mmcv-2.1.0-*.whl" goto :build_mmcv
echo [setup_env] reusing the mmcv wheel built earlier for this torch (%WHEELS%)
goto :install_mmcv
:build_mmcv
if not defined PLAN_MMCV_BUILD goto :build_mmcv_ok
if "%PLAN_MMCV_BUILD%"=="ok" goto :build_mmcv_ok
echo [setup_env] no mmcv wheel for this torch and no way to build one (see above)
goto :fail
:build_mmcv_ok
echo [setup_env] building %MMCV_REQ% with ops from source (needs Visual Studio Build Tools; once per torch build)
if not exist "%WHEELS%\" mkdir "%WHEELS%"
set "MMCV_WITH_OPS=1"
set "MAX_JOBS=%NUMBER_OF_PROCESSORS%"
set "MMCV_BUILT=1"
"%PY%" -m pip wheel -c "%CONSTRAINTS%" --no-deps --no-build-isolation --no-cache-dir -w "%WHEELS%" %MMCV_REQ%
if errorlevel 1 goto :fail
:install_mmcv
rem (wine's "for" matches no wildcard inside quotes: it runs in the folder)
set "MMCV_WHEEL="
pushd "%WHEELS%"
for %%w in (mmcv-2.1.0-*.whl) do set "MMCV_WHEEL=%%~fw"
popd
if not defined MMCV_WHEEL goto :fail
"%PY%" -m pip install -c "%CONSTRAINTS%" --no-deps --force-reinstall "%MMCV_WHEEL%"
if errorlevel 1 goto :fail
if defined MMCV_BUILT goto :check_built
"%PY%" -c "%MMCV_OK%" >nul 2>&1
if not errorlevel 1 goto :stack
echo [setup_env] that wheel does not work with this torch: building again
del "%WHEELS%\mmcv-2.1.0-*.whl"
goto :build_mmcv
:check_built
"%PY%" -c "%MMCV_OK%"
if errorlevel 1 goto :fail

rem 4. The OpenMMLab detection stack, TensorBoard and test tools; then
rem mmsafe itself, editable (its requirements are all present by now).
:stack
echo [setup_env] installing mmengine, mmdet, tensorboard, test tools
"%PY%" -m pip install -c "%CONSTRAINTS%" mmengine==0.10.7 mmdet==3.3.0 tensorboard pytest pytest-timeout pytest-xdist psutil
if errorlevel 1 goto :fail
"%PY%" -m pip install --no-deps --no-build-isolation -e "%ROOT%"
if errorlevel 1 goto :fail
"%PY%" "%PLAN%" numpy
if errorlevel 1 goto :fail
"%PY%" -c "import mmsafe, mmdet, mmcv, numpy, torch; print('[setup_env] ok: torch', torch.__version__, 'numpy', numpy.__version__, 'mmcv', mmcv.__version__, 'mmdet', mmdet.__version__, 'mmsafe', mmsafe.__version__)"
if errorlevel 1 goto :fail
exit /b 0

:fail
echo [setup_env] FAILED, see the messages above.
exit /b 1

@echo off
rem One click on Windows: UTF-8 console, activate .venv, TensorBoard in its own
rem window, the browser at its port, then training in this window. The window
rem stays open at the end and shows the log tail when training fails.
rem Usage: tools\train_with_tensorboard.bat [CONFIG] [PORT] [WORK_DIR] [train.py args...]
rem   CONFIG    default configs\llvip\demo_cpu.py
rem   PORT      default 6006
rem   WORK_DIR  default work_dirs\<config name>
rem   Everything after WORK_DIR goes to tools\train.py unchanged, e.g.
rem   --resume --cfg-options train_cfg.max_epochs=24; "" keeps a default.
setlocal EnableExtensions DisableDelayedExpansion
chcp 65001 >nul
set "PYTHONUTF8=1"
set "PYTHONIOENCODING=utf-8"
cd /d "%~dp0.."
set "CONFIG=%~1"
if "%CONFIG%"=="" set "CONFIG=configs\llvip\demo_cpu.py"
set "PORT=%~2"
if "%PORT%"=="" set "PORT=6006"
set "WORK_DIR=%~3"
for %%F in ("%CONFIG%") do set "NAME=%%~nF"
if "%WORK_DIR%"=="" set "WORK_DIR=work_dirs\%NAME%"

rem The train.py arguments are the raw command line after the first three
rem arguments. cmd splits %%4, %%5... at "=" too, so they are cut out of %%*
rem instead: each strip removes up to the end of the next leading argument.
set "TRAIN_ARGS="
if "%~4"=="" goto :have_args
set "TRAIN_ARGS=%*"
call set "TRAIN_ARGS=%%TRAIN_ARGS:*%1=%%"
call set "TRAIN_ARGS=%%TRAIN_ARGS:*%2=%%"
call set "TRAIN_ARGS=%%TRAIN_ARGS:*%3=%%"
:have_args

if exist ".venv\Scripts\activate.bat" goto :activate
echo [mmsafe] .venv not found: running tools\setup_env.bat first
call tools\setup_env.bat
if errorlevel 1 goto :failed_setup
:activate
call .venv\Scripts\activate.bat
if not exist "%WORK_DIR%" mkdir "%WORK_DIR%"

echo [mmsafe] TensorBoard on http://localhost:%PORT% (logdir %WORK_DIR%)
start "TensorBoard %PORT%" cmd /k python -m tensorboard.main --logdir "%WORK_DIR%" --port %PORT%
timeout /t 4 /nobreak >nul
start "" "http://localhost:%PORT%"

echo [mmsafe] training: python tools\train.py %CONFIG% --work-dir %WORK_DIR%%TRAIN_ARGS%
echo [mmsafe] watch train/loss_macl (must appear, falling), grad_norm, val/pascal_voc/mAP
python tools\train.py "%CONFIG%" --work-dir "%WORK_DIR%"%TRAIN_ARGS%
if errorlevel 1 goto :failed
echo [mmsafe] training finished. TensorBoard keeps running in its own window.
pause
exit /b 0

:failed
echo [mmsafe] training FAILED. Last lines of the newest log:
powershell -NoProfile -Command "Get-ChildItem -Path '%WORK_DIR%' -Recurse -Filter *.log | Sort-Object LastWriteTime | Select-Object -Last 1 | Get-Content -Tail 40"
pause
exit /b 1

:failed_setup
echo [mmsafe] set-up FAILED, see the messages above.
pause
exit /b 1

#!/usr/bin/env bash
# Create (or reuse) .venv and install one of mmsafe's stacks, in order:
#   torch -> numpy that this torch can use -> mmcv (OpenMMLab's prebuilt
#   wheel if one exists, else a source build with ops, kept per torch build)
#   -> mmengine, mmdet, tensorboard, test tools -> mmsafe (editable).
# Idempotent: on a ready environment it only verifies and exits in seconds.
# What to install is chosen by tools/setup_plan.py (shared with
# tools/setup_env.bat): by default torch 2.1.2, the stack for which OpenMMLab
# publishes prebuilt mmcv 2.1.0 (CUDA 12.1 build with an NVIDIA GPU, CPU build
# otherwise; Python 3.12+ takes the oldest torch that has a wheel for it).
#
# MMSAFE_STACK=oldest takes the oldest supported stack instead (torch
# 2.0.1, mmcv 2.0.1, mmengine 0.7.4, mmdet 3.0.0), MMSAFE_STACK=newest the
# newest (see tools/setup_plan.py).
#
# Variables:
#   MMSAFE_STACK         default | oldest | newest
#   MMSAFE_MMCV, MMSAFE_MMENGINE, MMSAFE_MMDET
#                        replace the stack's mmcv version (2.0.1, 2.1.0)
#                        and mmengine / mmdet requirements
#   MMSAFE_VENV          venv folder (default: <repo>/.venv)
#   MMSAFE_PYTHON        interpreter used to create the venv (default python3)
#   MMSAFE_TORCH         torch requirement, e.g. torch==2.13.0 (default: see
#                        above). An already-installed torch is always kept.
#   MMSAFE_TORCH_INDEX   extra index for torch (a CUDA or CPU wheel index);
#                        "none": PyPI only
#   MMSAFE_MMCV_INDEX    prebuilt mmcv wheel index (find-links URL); "none"
#                        builds from source. Default: OpenMMLab's index for
#                        this torch/CUDA, tried with short timeouts.
#   MMSAFE_GPU           1/0: take the CUDA/CPU torch build (default: CUDA
#                        when nvidia-smi lists a GPU)
#   MMSAFE_CACHE_DIR     where source-built mmcv wheels are kept, one folder
#                        per torch build (default ~/.cache/mmsafe)
#   MMSAFE_MMCV_BUILD    auto (default): compile mmcv from source when no
#                        prebuilt or earlier-built wheel fits this torch;
#                        never: stop there instead, with exit status 3
#                        (before torch is downloaded, when the planner can
#                        tell: tools/setup_plan.py mmcv-wheel)
#   MMSAFE_FORCE=1       reinstall mmsafe's layer even when the stamp matches
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMSAFE_VENV:-$ROOT/.venv}"
PY_BOOT="${MMSAFE_PYTHON:-python3}"
PLAN="$ROOT/tools/setup_plan.py"
STAMP="$VENV/.mmsafe-setup"
CONSTRAINTS="$VENV/mmsafe-constraints.txt"
START=$(date +%s)

say() { echo "[setup_env] $*"; }
# KEY=VALUE lines of tools/setup_plan.py -> shell variables PLAN_KEY
read_plan() {
  local line
  while IFS= read -r line; do
    [ -n "$line" ] && printf -v "PLAN_${line%%=*}" '%s' "${line#*=}"
  done
}

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment at $VENV"
  "$PY_BOOT" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

# Everything that decides what gets installed goes into the stamp.
WANT="$(cat "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/requirements.txt" "$0" "$PLAN" | sha256sum | cut -c1-16) ${MMSAFE_STACK:-default} ${MMSAFE_TORCH:-} ${MMSAFE_MMCV:-} ${MMSAFE_MMENGINE:-} ${MMSAFE_MMDET:-}"
if [ "${MMSAFE_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
   && "$PY" -c "import mmsafe" >/dev/null 2>&1; then
  say "environment ready ($VENV), nothing to do ($(( $(date +%s) - START ))s)"
  exit 0
fi

# 0. the stack: mmcv's version, the mmengine and mmdet requirements
read_plan < <("$PY_BOOT" "$PLAN" stack)
MMCV_VERSION="$PLAN_MMCV_VERSION"
MMCV_REQ="mmcv==$MMCV_VERSION"
say "stack: ${PLAN_STACK} (mmcv $MMCV_VERSION, $PLAN_MMENGINE_REQ, $PLAN_MMDET_REQ)"

# 1. torch (keep an existing one; the user may have chosen a CUDA build).
if "$PY" -c "import torch" >/dev/null 2>&1; then
  say "keeping installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  PLAN_NOTE=""; PLAN_TORCH_INDEX=""
  read_plan < <("$PY" "$PLAN" torch)
  [ -n "$PLAN_NOTE" ] && say "$PLAN_NOTE"
  if [ "${MMSAFE_MMCV_BUILD:-auto}" = never ]; then
    PLAN_NOTE=""; PLAN_MMCV_WHEEL=maybe
    read_plan < <("$PY" "$PLAN" mmcv-wheel "$PLAN_TORCH_REQ")
    if [ "$PLAN_MMCV_WHEEL" = no ]; then
      say "$PLAN_NOTE, and MMSAFE_MMCV_BUILD=never: stopping before torch's download (unset MMSAFE_MMCV_BUILD to build mmcv from source, 7-15 minutes on 2 cores)"
      exit 3
    fi
  fi
  say "installing $PLAN_TORCH_REQ${PLAN_TORCH_INDEX:+ (extra index $PLAN_TORCH_INDEX)}"
  EXTRA=()
  if [ -n "$PLAN_TORCH_INDEX" ]; then EXTRA=(--extra-index-url "$PLAN_TORCH_INDEX"); fi
  "${PIP[@]}" install "${EXTRA[@]}" "$PLAN_TORCH_REQ"
fi

# 2. numpy that this torch can exchange arrays with. A torch built against
#    numpy 1.x (torch 2.1/2.2) cannot use numpy 2, and opencv >= 4.11 needs
#    numpy 2: both are then held below 2 / 4.11 for every later install.
"$PY" "$PLAN" numpy-pin > "$CONSTRAINTS"
if [ -s "$CONSTRAINTS" ]; then
  say "this torch was built against numpy 1.x: keeping $(tr '\n' ' ' < "$CONSTRAINTS")for every install"
fi
for pin in $PLAN_PINS; do
  echo "$pin" >> "$CONSTRAINTS"
  say "the $PLAN_STACK stack keeps $pin for every install"
done
"${PIP[@]}" install -c "$CONSTRAINTS" numpy
"$PY" "$PLAN" numpy
PIPC=("${PIP[@]}" install -c "$CONSTRAINTS")

# 3. mmcv with compiled ops that run against THIS torch. mmcv imports
#    mmengine, so mmengine comes first (else every check of mmcv fails).
"${PIPC[@]}" "$PLAN_MMENGINE_REQ"
MMCV_OK='import torch, mmcv; from mmcv.ops import nms
assert mmcv.__version__ == "'"$MMCV_VERSION"'", mmcv.__version__
b = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]])
assert nms(b, torch.tensor([0.9, 0.8]), 0.5)[1].tolist() == [0]'
if "$PY" -c "$MMCV_OK" >/dev/null 2>&1; then
  say "mmcv $("$PY" -c 'import mmcv; print(mmcv.__version__)') with ops already installed"
else
  "${PIPC[@]}" "setuptools<70" wheel ninja packaging
  PLAN_NOTE=""; PLAN_MMCV_BUILD=ok
  read_plan < <("$PY" "$PLAN" mmcv)
  GOT_WHEEL=0
  if [ "$PLAN_MMCV_INDEX" != none ]; then
    say "looking for a prebuilt $MMCV_REQ wheel at $PLAN_MMCV_INDEX (short timeouts)"
    if timeout 300 "${PIPC[@]}" --only-binary=mmcv --no-deps --timeout 10 --retries 0 \
         -f "$PLAN_MMCV_INDEX" "$MMCV_REQ" >/dev/null 2>&1 \
       && "$PY" -c "$MMCV_OK" >/dev/null 2>&1; then
      GOT_WHEEL=1
      say "installed OpenMMLab's prebuilt mmcv wheel"
    else
      say "no usable prebuilt mmcv wheel there"
    fi
  elif [ -n "$PLAN_NOTE" ]; then
    say "$PLAN_NOTE"
  fi
  if [ "$GOT_WHEEL" = 0 ]; then
    WHEELS="$PLAN_MMCV_WHEEL_DIR"
    # pip's own cache keys a built wheel by its source, not by the torch it
    # was compiled against: builds are kept per torch build here instead.
    if ls "$WHEELS"/mmcv-"$MMCV_VERSION"-*.whl >/dev/null 2>&1; then
      say "reusing the mmcv wheel built earlier for this torch ($WHEELS)"
      "${PIPC[@]}" --no-deps --force-reinstall "$WHEELS"/mmcv-"$MMCV_VERSION"-*.whl
      if ! WHY="$("$PY" -c "$MMCV_OK" 2>&1)"; then
        say "that wheel does not work with this torch (${WHY##*$'\n'}): building again"
        rm -f "$WHEELS"/mmcv-"$MMCV_VERSION"-*.whl
      fi
    fi
    if ! ls "$WHEELS"/mmcv-"$MMCV_VERSION"-*.whl >/dev/null 2>&1; then
      if [ "${PLAN_MMCV_BUILD:-ok}" != ok ]; then
        say "$PLAN_MMCV_BUILD"
        exit 1
      fi
      if [ "${MMSAFE_MMCV_BUILD:-auto}" = never ]; then
        say "no prebuilt or earlier-built $MMCV_REQ wheel for this torch, and MMSAFE_MMCV_BUILD=never: not compiling it (unset MMSAFE_MMCV_BUILD to build it from source, 7-15 minutes on 2 cores)"
        exit 3
      fi
      JOBS="$(nproc 2>/dev/null || echo 2)"
      say "building $MMCV_REQ with ops for torch $("$PY" -c 'import torch; print(torch.__version__)') (MAX_JOBS=$JOBS; 7-15 minutes on 2 cores, once per torch build)"
      mkdir -p "$WHEELS"
      # -g0: no debug information (Python's own flags ask for -g): mmcv
      # 2.1.0 for torch 2.13 built in 433 s on 2 idle cores into a 1.4 MB
      # wheel (9-13 minutes, 29 MB with it). A user's own CFLAGS is kept.
      CFLAGS="${CFLAGS--g0}" MMCV_WITH_OPS=1 MAX_JOBS="$JOBS" "${PIP[@]}" wheel -c "$CONSTRAINTS" --no-deps \
        --no-build-isolation --no-cache-dir -w "$WHEELS" "$MMCV_REQ"
      "${PIPC[@]}" --no-deps --force-reinstall "$WHEELS"/mmcv-"$MMCV_VERSION"-*.whl
    fi
  fi
  "$PY" -c "$MMCV_OK"
fi

# 4. The OpenMMLab detection stack, TensorBoard and test tools.
say "installing mmengine, mmdet, tensorboard, test tools"
"${PIPC[@]}" "$PLAN_MMENGINE_REQ" "$PLAN_MMDET_REQ" tensorboard tqdm packaging pytest pytest-timeout pytest-xdist psutil

# 5. mmsafe itself, editable; its requirements are all present by now.
"${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT"

"$PY" "$PLAN" numpy
"$PY" - <<'PYEOF'
import mmcv, mmdet, mmengine, numpy, torch
import mmsafe
print(f'[setup_env] ok: torch {torch.__version__}, numpy {numpy.__version__}, '
      f'mmcv {mmcv.__version__}, mmengine {mmengine.__version__}, '
      f'mmdet {mmdet.__version__}, mmsafe {mmsafe.__version__}')
PYEOF
echo "$WANT" > "$STAMP"
say "done in $(( $(date +%s) - START ))s"

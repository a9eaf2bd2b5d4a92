#!/usr/bin/env bash
# Create (or reuse) .venv and install mmsafe's stack, in order:
#   torch -> mmcv (prebuilt wheel if one exists, else a source build with
#   ops) -> mmengine, mmdet, tensorboard, test tools -> mmsafe (editable).
# Idempotent: on a ready environment it only verifies and exits in seconds.
#
# Variables:
#   MMSAFE_VENV          venv folder (default: <repo>/.venv)
#   MMSAFE_PYTHON        interpreter used to create the venv (default python3)
#   MMSAFE_TORCH         torch requirement (default: torch==2.13.0, which is
#                        the CPU build on machines that carry it locally).
#                        An already-installed torch is always kept.
#   MMSAFE_TORCH_INDEX   extra index for torch, e.g. a CUDA or CPU wheel index
#   MMSAFE_MMCV_INDEX    prebuilt mmcv wheel index (find-links URL); "none"
#                        skips the attempt. Default: OpenMMLab's index for
#                        this torch/CUDA, tried with short timeouts.
#   MMSAFE_FORCE=1       reinstall mmsafe's layer even when the stamp matches
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMSAFE_VENV:-$ROOT/.venv}"
PY_BOOT="${MMSAFE_PYTHON:-python3}"
TORCH_REQ="${MMSAFE_TORCH:-torch==2.13.0}"
MMCV_REQ="mmcv==2.1.0"
STAMP="$VENV/.mmsafe-setup"
START=$(date +%s)

say() { echo "[setup_env] $*"; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment at $VENV"
  "$PY_BOOT" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

# Everything that decides what gets installed goes into the stamp.
WANT="$(cat "$ROOT/setup.py" "$ROOT/requirements.txt" "$0" | sha256sum | cut -c1-16) $TORCH_REQ"
if [ "${MMSAFE_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
   && "$PY" -c "import mmsafe" >/dev/null 2>&1; then
  say "environment ready ($VENV), nothing to do ($(( $(date +%s) - START ))s)"
  exit 0
fi

# 1. torch (keep an existing one; the user may have chosen a CUDA build).
if "$PY" -c "import torch" >/dev/null 2>&1; then
  say "keeping installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  say "installing $TORCH_REQ"
  EXTRA=()
  if [ -n "${MMSAFE_TORCH_INDEX:-}" ]; then EXTRA=(--extra-index-url "$MMSAFE_TORCH_INDEX"); fi
  "${PIP[@]}" install "${EXTRA[@]}" "$TORCH_REQ"
fi

# 2. mmcv with compiled ops.
if "$PY" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '2.1.0'" >/dev/null 2>&1; then
  say "mmcv $("$PY" -c 'import mmcv; print(mmcv.__version__)') with ops already installed"
else
  "${PIP[@]}" install "setuptools<70" wheel ninja packaging
  INDEX="${MMSAFE_MMCV_INDEX:-}"
  if [ -z "$INDEX" ]; then
    INDEX="$("$PY" - <<'PYEOF'
import torch
major_minor = '.'.join(torch.__version__.split('+')[0].split('.')[:2])
cuda = torch.version.cuda
tag = 'cu' + cuda.replace('.', '') if cuda else 'cpu'
print(f'https://download.openmmlab.com/mmcv/dist/{tag}/torch{major_minor}/index.html')
PYEOF
)"
  fi
  GOT_WHEEL=0
  if [ "$INDEX" != none ]; then
    say "looking for a prebuilt $MMCV_REQ wheel at $INDEX (short timeouts)"
    if timeout 90 "${PIP[@]}" install --only-binary=mmcv --no-deps --timeout 10 --retries 0 \
         -f "$INDEX" "$MMCV_REQ" >/dev/null 2>&1 \
       && "$PY" -c "import mmcv.ops" >/dev/null 2>&1; then
      GOT_WHEEL=1
      say "installed a prebuilt mmcv wheel"
    else
      say "no prebuilt mmcv wheel for this torch; building from source"
    fi
  fi
  if [ "$GOT_WHEEL" = 0 ]; then
    JOBS="$(nproc 2>/dev/null || echo 2)"
    say "building $MMCV_REQ with ops (MAX_JOBS=$JOBS; about 20 minutes on 2 cores the first time, instant when pip has the wheel cached)"
    MMCV_WITH_OPS=1 MAX_JOBS="$JOBS" "${PIP[@]}" install --no-build-isolation "$MMCV_REQ"
  fi
fi

# 3. The OpenMMLab detection stack, TensorBoard and test tools.
say "installing mmengine, mmdet, tensorboard, test tools"
"${PIP[@]}" install "mmengine==0.10.7" "mmdet==3.3.0" tensorboard pytest pytest-timeout pytest-xdist psutil

# 4. mmsafe itself, editable; its requirements are all present by now.
"${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT"

"$PY" - <<'PYEOF'
import mmcv, mmdet, mmengine, torch
import mmsafe
print(f'[setup_env] ok: torch {torch.__version__}, mmcv {mmcv.__version__}, '
      f'mmengine {mmengine.__version__}, mmdet {mmdet.__version__}, '
      f'mmsafe {mmsafe.__version__}')
PYEOF
echo "$WANT" > "$STAMP"
say "done in $(( $(date +%s) - START ))s"

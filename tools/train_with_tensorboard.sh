#!/usr/bin/env bash
# One command on Linux/macOS: start TensorBoard on the work dir, open the
# browser, train, and show the log tail if training fails.
#
# Usage: tools/train_with_tensorboard.sh [CONFIG] [PORT] [WORK_DIR] [train.py args...]
#   CONFIG    default configs/llvip/demo_cpu.py
#   PORT      default 6006
#   WORK_DIR  default work_dirs/<config name>
#   Everything after WORK_DIR goes to tools/train.py unchanged, e.g.
#   --resume --cfg-options train_cfg.max_epochs=24; "" keeps a default.
# PYTHON chooses the interpreter (default: .venv's once set up, else
# python3). MMSAFE_NO_BROWSER=1 skips opening the browser;
# MMSAFE_KEEP_TENSORBOARD=0 stops TensorBoard when training ends (default:
# keep it while the terminal is interactive, until Enter is pressed).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG="${1:-configs/llvip/demo_cpu.py}"
PORT="${2:-6006}"
NAME="$(basename "${CONFIG%.py}")"
WORK_DIR="${3:-work_dirs/$NAME}"
shift $(( $# < 3 ? $# : 3 ))
cd "$ROOT"
# The interpreter: $PYTHON when set, else .venv's once its set-up has
# finished (tools/setup_env.sh writes .venv/.mmsafe-setup last), else python3.
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ] && [ -f "$ROOT/.venv/.mmsafe-setup" ]; then
  PY="$ROOT/.venv/bin/python"
else
  if [ -x "$ROOT/.venv/bin/python" ]; then
    echo "[mmsafe] .venv's set-up has not finished (make setup): using python3"
  fi
  PY=python3
fi
export PYTHONIOENCODING=utf-8 PYTHONUTF8=1
mkdir -p "$WORK_DIR"

echo "[mmsafe] TensorBoard on http://localhost:$PORT (logdir $WORK_DIR)"
"$PY" -m tensorboard.main --logdir "$WORK_DIR" --port "$PORT" --bind_all \
    > "$WORK_DIR/tensorboard.out" 2>&1 &
TB_PID=$!
stop_tb() { kill "$TB_PID" 2>/dev/null; wait "$TB_PID" 2>/dev/null; }
trap 'stop_tb; exit 130' INT TERM
if [ "${MMSAFE_NO_BROWSER:-0}" != 1 ]; then
  (sleep 3; xdg-open "http://localhost:$PORT" >/dev/null 2>&1 || \
     open "http://localhost:$PORT" >/dev/null 2>&1 || true) &
fi

echo "[mmsafe] training: $PY tools/train.py $CONFIG --work-dir $WORK_DIR $*"
echo "[mmsafe] watch train/loss_macl (must appear, falling), grad_norm, val/pascal_voc/mAP"
"$PY" tools/train.py "$CONFIG" --work-dir "$WORK_DIR" "$@"
RC=$?
if [ $RC -ne 0 ]; then
  LOG="$(ls -t "$WORK_DIR"/*/*.log 2>/dev/null | head -1)"
  echo "[mmsafe] training FAILED (exit $RC). Last lines of ${LOG:-the log}:"
  [ -n "$LOG" ] && tail -n 40 "$LOG"
fi
if [ -t 0 ] && [ "${MMSAFE_KEEP_TENSORBOARD:-1}" = 1 ]; then
  read -r -p "[mmsafe] TensorBoard still at http://localhost:$PORT - press Enter to stop it. " _
fi
stop_tb
exit $RC

#!/usr/bin/env bash
# Usage: tools/dist_train.sh CONFIG NUM_PROCS [train.py args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT as environment variables.
# Works without a GPU too: mmsafe switches to the gloo backend on CPU.
#
# Stop signals: SIGTERM, SIGINT (Ctrl+C) or SIGUSR1 to this script reach
# every training process once (torchrun runs in its own session and gets
# SIGTERM; it passes it on and gives its workers 30 s). With mmsafe's
# PreemptionHook they stop at the same iteration, save
# WORK_DIR/preempted_iter_N.pth, and this script exits with their code (75
# by default; torchrun itself would exit 1). `--resume` continues the run.
set -uo pipefail
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Rank 0 writes the exit code here once the stop checkpoint is complete.
MMSAFE_EXIT_CODE_FILE="$(mktemp "${TMPDIR:-/tmp}/mmsafe-exit-code.XXXXXX")"
export MMSAFE_EXIT_CODE_FILE
PYTHONPATH="$DIR/..${PYTHONPATH:+:$PYTHONPATH}" \
setsid python -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" --master_port="$PORT" \
    "$DIR/train.py" "$CONFIG" --launcher pytorch "${@:3}" &
LAUNCHER=$!
STOPPING=0
stop() {
  # once: a second signal must not cut torchrun's wait for its workers
  if [ "$STOPPING" = 0 ]; then
    STOPPING=1
    echo "[dist_train.sh] $1: stopping the training processes (they save a checkpoint)" >&2
    kill -TERM "$LAUNCHER" 2>/dev/null
  else
    echo "[dist_train.sh] $1 again: already stopping" >&2
  fi
}
trap 'stop SIGTERM' TERM
trap 'stop SIGINT' INT
trap 'stop SIGUSR1' USR1
STATUS=0
while :; do
  wait "$LAUNCHER"
  STATUS=$?
  kill -0 "$LAUNCHER" 2>/dev/null || break  # else: a trapped signal
done
if [ -s "$MMSAFE_EXIT_CODE_FILE" ]; then
  STATUS=$(cat "$MMSAFE_EXIT_CODE_FILE")
fi
rm -f "$MMSAFE_EXIT_CODE_FILE"
exit "$STATUS"

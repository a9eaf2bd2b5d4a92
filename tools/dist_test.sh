#!/usr/bin/env bash
# Usage: tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py args...]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT as environment variables.
# Works without a GPU too: mmsafe switches to the gloo backend on CPU.
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHONPATH="$DIR/..${PYTHONPATH:+:$PYTHONPATH}" \
python -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" --master_port="$PORT" \
    "$DIR/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"

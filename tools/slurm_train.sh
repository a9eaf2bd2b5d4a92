#!/usr/bin/env bash
# Train on a Slurm cluster (MMDetection's slurm_train.sh, plus preemption):
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SIGNAL_LEAD=120] \
#   [SRUN_ARGS="..."] tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR \
#       [train.py args...]
#
# From a login node srun allocates the job. Submitted as a batch job, Slurm
# can also requeue it:
#
#   sbatch --requeue -p PARTITION -J JOB_NAME --ntasks=8 --gres=gpu:8 \
#       tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR
#
# srun asks Slurm for SIGUSR1 SIGNAL_LEAD seconds before the time limit
# (--signal). On it, or on the SIGTERM of a preemption, mmsafe's
# PreemptionHook stops every rank at the same iteration (at most one log
# interval later), saves WORK_DIR/preempted_iter_N.pth and the tasks exit
# with code 75 (PREEMPTED_EXIT_CODE). Inside a batch job this script then
# requeues it (scontrol requeue); the requeued job runs this script again,
# and --resume (always passed) continues from that checkpoint exactly. Set
# SIGNAL_LEAD above one log interval plus the time a checkpoint takes.
#
# No --kill-on-bad-exit: the tasks of a preempted run exit with 75 one after
# the other, and a rank that fails is reported and ended by mmsafe itself
# (within mmsafe_peer_grace seconds).
set -uo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(( GPUS < 8 ? GPUS : 8 ))}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SIGNAL_LEAD=${SIGNAL_LEAD:-120}
PREEMPTED_EXIT_CODE=${PREEMPTED_EXIT_CODE:-75}
SRUN_ARGS=${SRUN_ARGS:-""}
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# shellcheck disable=SC2086  # SRUN_ARGS holds several options
PYTHONPATH="$DIR/..${PYTHONPATH:+:$PYTHONPATH}" \
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --signal=USR1@"$SIGNAL_LEAD" \
    $SRUN_ARGS \
    python -u "$DIR/train.py" "$CONFIG" --work-dir="$WORK_DIR" \
    --launcher=slurm --resume "${@:5}"
STATUS=$?
if [ "$STATUS" = "$PREEMPTED_EXIT_CODE" ]; then
  echo "[slurm_train.sh] stopped by a signal; checkpoint in $WORK_DIR (see last_checkpoint)"
  if [ -n "${SLURM_JOB_ID:-}" ] && scontrol requeue "$SLURM_JOB_ID"; then
    echo "[slurm_train.sh] job $SLURM_JOB_ID requeued: it continues with --resume"
    exit 0
  fi
fi
exit "$STATUS"

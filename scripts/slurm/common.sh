# Sourced by the sbatch templates in scripts/slurm/: run directory per job, profile, signal
# forwarding and requeue on preemption. Not a program of its own.
#
# Environment a user may set at submission (sbatch --export=ALL,...):
#   MT_REPO       the meshtrain checkout (default: the submit directory)
#   MT_TRAINER    the trainer binary (default $MT_REPO/build/bin/trainer)
#   MT_RUN_ROOT   where run directories go (default $MT_REPO/runs); one per job: <job name>-<job id>
#   MT_PROFILE    NCCL environment profile (topo/profiles/*.env name or a path): --topo.profile
#   MT_TOPO_FILE  NCCL topology XML of the nodes: --topo.file
#   MT_REQUEUE    requeue the job when the trainer stopped on the preemption signal (default 1)
#   (preemption: give --signal=B:USR1@T a lead time T above one step plus a checkpoint save; a
#   SIGTERM that reaches mpirun itself starts Open MPI's kill sequence, which ends the ranks ~1 s
#   later and no setting of it lets them finish a save; srun forwards TERM to the tasks and Slurm's
#   KillWait is their grace)

MT_REPO="${MT_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}"
MT_TRAINER="${MT_TRAINER:-$MT_REPO/build/bin/trainer}"
MT_RUN_ROOT="${MT_RUN_ROOT:-$MT_REPO/runs}"
MT_REQUEUE="${MT_REQUEUE:-1}"

mt_log() { echo "[meshtrain-slurm $(date +%H:%M:%S) job ${SLURM_JOB_ID:-?}] $*" >&2; }

# The trainer arguments for this job: the config and overrides the user passed, then the run
# directory (stable across requeues: the job id does not change, so resume finds the checkpoints).
mt_trainer_args() {
  local config="$1"
  shift
  [[ -f "$config" ]] || config="$MT_REPO/$config"
  MT_RUN_NAME="${SLURM_JOB_NAME:-meshtrain}-${SLURM_JOB_ID:-local}"
  MT_RUN_DIR="$MT_RUN_ROOT/$MT_RUN_NAME"
  MT_ARGS=(--config "$config" "--run.dir=$MT_RUN_ROOT" "--run.name=$MT_RUN_NAME" "--checkpoint.resume=auto")
  [[ -n "${MT_PROFILE:-}" ]] && MT_ARGS+=("--topo.profile=$MT_PROFILE")
  [[ -n "${MT_TOPO_FILE:-}" ]] && MT_ARGS+=("--topo.file=$MT_TOPO_FILE")
  MT_ARGS+=("$@")
}

# Runs the launcher command in the background, forwards SIGUSR1/SIGTERM to it as SIGUSR1 (sbatch
# --signal=B:USR1@T signals this shell only; USR1 is forwarded by mpirun and srun to every task
# without starting their kill sequence, which TERM would), waits, and requeues when the trainer
# left the PREEMPTED marker. Returns the launcher's exit code.
mt_run() {
  mkdir -p "$MT_RUN_ROOT"
  mt_log "run directory $MT_RUN_DIR (restart ${SLURM_RESTART_COUNT:-0}); $*"
  "$@" &
  local pid=$! rc=0
  trap 'mt_log "SIGUSR1: asking the trainer to checkpoint and stop"; kill -USR1 $pid 2>/dev/null || true' USR1
  trap 'mt_log "SIGTERM: asking the trainer to checkpoint and stop (as SIGUSR1)"; kill -USR1 $pid 2>/dev/null || true' TERM
  while true; do
    set +e
    wait "$pid"
    rc=$?
    set -e
    # wait returns early (>128) when a trapped signal arrives; the launcher is still running.
    if kill -0 "$pid" 2>/dev/null; then continue; fi
    break
  done
  trap - USR1 TERM
  if [[ -f "$MT_RUN_DIR/PREEMPTED" ]]; then
    mt_log "trainer stopped at step $(cat "$MT_RUN_DIR/PREEMPTED") on the preemption signal"
    if [[ "$MT_REQUEUE" == 1 && -n "${SLURM_JOB_ID:-}" ]]; then
      mt_log "requeueing job $SLURM_JOB_ID; it resumes from $MT_RUN_DIR/checkpoints"
      scontrol requeue "$SLURM_JOB_ID"
    fi
    return 0
  fi
  mt_log "trainer exited with code $rc"
  return "$rc"
}

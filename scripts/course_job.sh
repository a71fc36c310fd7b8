# The body of the course's batch jobs, sourced by scripts/slurm/*.sbatch and
# scripts/pbs/*.pbs after their scheduler header. Those files only set
# SCHEDULER (slurm or pbs) and REPO and call one function below, so the
# commands that run are the same under both schedulers; only how the
# allocation is read and how tasks reach other nodes differ.
#
# Environment (all optional; the defaults assume the job was submitted from
# the repository root, which holds .venv/):
#   REPO         the repository (default: the submit directory)
#   PYTHON       its interpreter (default: $REPO/.venv/bin/python)
#   BATCH_PYTHON the interpreter of the job's own decisions and messages
#                (tf_resnet/jobs/: no TensorFlow, no package;
#                default: $REPO/.venv/bin/python if it exists, else PYTHON)
#   DATA_ROOT    where the datasets are (default: $REPO/datasets, where
#                data/download.py puts them): cifar-100-binary/{train,test}.bin,
#                tiny-imagenet-200/; the job's first line says what it reads
#   TRAIN_DATA, EVAL_DATA  the files of this task (default: under DATA_ROOT)
#   PRETRAINED   resnet18_cifar100's ImageNet weights
#                (default: $REPO/weights/resnet18-f37072fd.pth)
#   LOG_ROOT     the run directory (default: $HOME/runs/<preset>-<job id>);
#                resubmitting with the same LOG_ROOT resumes the run
#   EXTRA_FLAGS  appended to every resnet_main.py command; they win over the
#                preset (e.g. "--train_epochs=30 --dtype=float32")
#   MODULES      environment modules to load first, e.g. "gcc openmpi"
#                (`module load $MODULES`; Lmod or Environment Modules)
#   ENGINE       sync task: horovod (default: one rank per task slot, see
#                LAUNCHER) or multi_worker (--distribution=multi_worker, one
#                worker per task slot started by srun or pbsdsh; no Horovod
#                needed)
#   LAUNCHER     sync task, horovod: horovodrun (default: ranks of other
#                nodes over ssh, Gloo), srun (Slurm: `srun --mpi=$SRUN_MPI`,
#                Horovod on MPI, no ssh), mpirun (the MPI's own launcher,
#                which reads the allocation) or aprun (Cray ALPS under PBS:
#                `aprun -n N -N RANKS_PER_NODE`, Horovod on Cray MPICH).
#                aprun is every task's (the batch shell runs on a service
#                node): the one-node tasks `aprun -n 1 -N 1`, the
#                multi_worker workers and the async job's ps and workers a
#                PE each (their index from ALPS_APP_PE); the async
#                coordinator stays in the batch shell. scripts/cray/ sets it
#   RANKS_PER_NODE  LAUNCHER=aprun: ranks (tasks) on each node (default:
#                the node's task slots in $PBS_NODEFILE); the course's
#                `aprun -n 2 -N 1` on `nodes=2:ppn=16:xk` is RANKS_PER_NODE=1
#   APRUN_FLAGS  LAUNCHER=aprun: extra aprun flags (e.g. "-cc none"); each
#                PE gets its share of the node's slots as -d unless these
#                give one (ALPS binds a PE to -d CPUs, by default one)
#   SRUN_MPI     LAUNCHER=srun: Slurm's MPI plugin (default pmix)
#   HOROVOD_FLAGS  sync task, horovod: extra horovodrun flags
#                (e.g. "--network-interface ib0")
#   MAX_REQUEUES Slurm: how often a job whose step lost a task (a node gone:
#                exit 4), or that Slurm started without its GPUs, requeues
#                itself (default 2)
#   MW_PORT      sync task, multi_worker: task i listens on MW_PORT + i
#                (default: the job's base port, see job_port in
#                tf_resnet/jobs/allocation.py)
#   NUM_PS       async task: how many tasks are parameter servers (default 1)
#   PS_PORT      async task: task i listens on PS_PORT + i (default: the
#                job's base port)
#   STOP_TIMEOUT async task: seconds the coordinator has to checkpoint and
#                exit after a stop signal or a lost server (default 120)
#
# Stops and requeues (Slurm): the job's training processes turn SIGTERM into
# a checkpoint at a step they all agree on, then exit. Slurm sends SIGTERM
# to every process of the job when it is cancelled, preempted or requeued
# (`scontrol requeue`); a requeued job starts again with the same job id,
# hence the same default LOG_ROOT, and resumes from that checkpoint. Ahead
# of the time limit the headers ask Slurm for SIGUSR1 to this shell
# (`#SBATCH --signal=B:USR1@300`): the training is stopped the same way and
# the job requeues itself (`#SBATCH --requeue`), so a run longer than the
# time limit goes on in the next allocation instead of ending TIMEOUT.
#
# A node lost in the middle of a job step (srun): the other tasks exit 4
# ("lost a task of the training cluster"), but srun waits for the lost
# node's tasks until the time limit. Each task of a step writes its exit
# code to a file; STEP_GRACE seconds (default 30) after a task failed, the
# step is ended. A lost task (4) requeues the job, up to MAX_REQUEUES
# times; bad input (2) or a divergence (3) would only fail again, and ends
# the job FAILED.

PYTHON=${PYTHON:-$REPO/.venv/bin/python}
# resnet_main.py's default (tf_resnet/native_log.py), for horovodrun too: it
# imports TensorFlow, whose start-up INFO lines would open every Horovod
# job's output.
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
# Read by the jobs of tf_resnet/jobs/ and by scripts/train_horovod.*.
DATA_ROOT=${DATA_ROOT:-$REPO/datasets}
read -ra EXTRA <<<"${EXTRA_FLAGS:-}"
# ${a[@]+"${a[@]}"}: an empty array, which bash before 4.4 calls unbound
# under set -u.
# The run directory and the script that submits the task again, once
# planned (`plan_task`); the signal that stopped the job, if one did.
RUN_DIR="" JOB_SCRIPT="" STOPPED=""

log() { echo "$(date -u +%H:%M:%S) course_job: $*" >&2; }

# The job's decisions and messages: tf_resnet/jobs/ of the checkout this
# file is in (no TensorFlow), run by BATCH_PYTHON with the shell's
# variables. It logs its own lines; what it prints is read back, a value a
# line. It ignores the stop signals, which qdel sends to every process of
# the job: killed, it would fail, and set -e end the job before it says
# where the run stopped.
TF_RESNET_SRC=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${BATCH_PYTHON:-} ]]; then
  BATCH_PYTHON=$PYTHON
  if [[ -x $REPO/.venv/bin/python ]]; then BATCH_PYTHON=$REPO/.venv/bin/python; fi
fi
batch_job() (
  trap '' TERM INT
  SCHEDULER=$SCHEDULER REPO=$REPO PYTHON=$PYTHON DATA_ROOT=$DATA_ROOT \
    RUN_DIR=$RUN_DIR JOB_SCRIPT=$JOB_SCRIPT PWD=$PWD JOB_SHELL=$$ \
    PYTHONPATH=$TF_RESNET_SRC${PYTHONPATH:+:$PYTHONPATH} \
    exec "$BATCH_PYTHON" -S -m tf_resnet.jobs "$@"
)

# `module load $MODULES`, where a cluster has environment modules; nothing
# when MODULES is empty. Batch shells do not always define `module`: it is
# looked for in the usual init files of Lmod and Environment Modules.
load_modules() {
  [[ -n ${MODULES:-} ]] || return 0
  if ! type module >/dev/null 2>&1; then
    local init
    for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh \
      /usr/share/lmod/lmod/init/bash /usr/share/modules/init/bash \
      /opt/modules/default/init/bash; do
      if [[ -f $init ]]; then
        # shellcheck disable=SC1090
        set +u && source "$init" && set -u
        break
      fi
    done
  fi
  if ! type module >/dev/null 2>&1; then
    log "error: MODULES=$MODULES, but this node has no module command"
    exit 2
  fi
  local name names
  read -ra names <<<"$MODULES"
  for name in "${names[@]}"; do
    # Lmod's and Environment Modules' `module` read unset variables.
    set +u
    if ! module load "$name"; then
      log "error: module load $name failed"
      exit 2
    fi
    set -u
  done
  log "modules loaded: $MODULES"
}
load_modules

# Runs the job's command in the background and polls it every second: bash
# runs no trap while a foreground command runs, so only this way does the
# shell act on a signal within a second. SIGTERM needs no passing on: the
# scheduler sends it to every process of the job (scancel, requeue,
# preemption; qdel), and the training processes agree on the step to stop
# at among themselves. SIGUSR1, the time limit's warning, stops the
# training the same way and requeues the job once it has exited. With
# STEP_STATUS set (a job step, each of whose tasks writes its exit code
# there: scripts/task.sh), a failed task ends the step STEP_GRACE seconds
# later and a lost task requeues the job. Returns the command's exit code,
# or the failed task's.
run_job_command() {
  local code=0 failed=""
  REQUEUE=0 STOPPED=""
  "$@" &
  JOB_COMMAND=$!
  record_stop_signals
  trap 'time_limit_near' USR1
  watch_job_command
  wait "$JOB_COMMAND" || code=$?
  record_stop_signals
  if [[ -n ${STEP_STATUS:-} ]]; then
    # Every task that exited has written its code. (A command substitution
    # that a stop signal ends fails: not a reason to end the job there.)
    failed=$(batch_job failed_task "$STEP_STATUS") || failed=""
    rm -rf "$STEP_STATUS"
    rmdir "$(dirname "$STEP_STATUS")" 2>/dev/null || true
    STEP_STATUS=""
  fi
  if [[ -n $failed ]]; then
    code=${failed#* }
    # A lost task (a node or a process of the step gone) is what a requeue
    # fixes, from the last checkpoint, up to MAX_REQUEUES times.
    if ((code == 4)) && batch_job lost_task; then REQUEUE=1; fi
  fi
  if ((REQUEUE)); then
    requeue_job
  elif [[ -n $STOPPED ]]; then
    report_stop
    # As the training processes exit, whatever a launcher made of it.
    code=$((128 + $(kill -l "$STOPPED")))
  elif [[ -n $failed ]]; then
    log "error: task ${failed% *} exited with code $code:" \
      "$(batch_job exit_cause "$code")"
  fi
  return "$code"
}

# Returns once JOB_COMMAND has exited, polling every second. A task of the
# job step (STEP_STATUS) that failed ends the step STEP_GRACE seconds later.
watch_job_command() {
  local failed_at=0 failed
  while kill -0 "$JOB_COMMAND" 2>/dev/null; do
    if [[ -n ${STEP_STATUS:-} ]] && ((!failed_at)); then
      failed=$(batch_job failed_task "$STEP_STATUS") || failed=""
      if [[ -n $failed ]]; then
        failed_at=$SECONDS
        log "task ${failed% *} of the job step exited with code ${failed#* }"
      fi
    fi
    if ((failed_at && SECONDS - failed_at >= ${STEP_GRACE:-30})); then
      log "the job step still runs ${STEP_GRACE:-30}s after a task failed" \
        "(a lost node?): ending it"
      kill -KILL "$JOB_COMMAND" 2>/dev/null || true
    fi
    sleep 1 || true # The stop signal ends sleep too (and set -e the job).
  done
}

# A stop signal only sets STOPPED, during the training and after it (Slurm
# may send SIGTERM more than once): the shell lives to say where the run
# stopped. Turns the time limit's warning off.
record_stop_signals() {
  trap 'STOPPED=TERM' TERM
  trap 'STOPPED=INT' INT
  trap - USR1
}

# Runs a launcher (horovodrun) that would end its children on SIGTERM with
# SIGTERM ignored: its ranks, whose own handler turns SIGTERM into a
# checkpoint, must get the time to agree on a step and write it.
ignoring_term() {
  trap '' TERM
  exec "$@"
}

time_limit_near() {
  log "the time limit is near: checkpointing, then requeueing the job"
  REQUEUE=1
  stop_training
}

# SIGTERM to the job's training processes, as the scheduler's stop would
# send it (`status.stop_training`).
stop_training() { batch_job stop_training; }

requeue_job() {
  if [[ $SCHEDULER != slurm ]]; then
    report_stop
    return
  fi
  batch_job requeue_line
  scontrol requeue "$SLURM_JOB_ID"
}

# The job's last lines after a stop signal (scancel, preemption, a requeue,
# qdel): where the run stopped, from what is on disk, and how it goes on.
report_stop() { batch_job stop_report "$STOPPED"; }

# need_data PATH DOWNLOAD_FLAGS VARIABLES: one error line and exit 2 (bad
# input, as resnet_main's) when PATH, a file, folder or glob, matches
# nothing; it names the download that fetches it and the variables.
need_data() { batch_job need_data "$@" || exit; }

# One line per task slot of the allocation, its host, in task order; and
# horovodrun's -H (host1:4,host2:4).
job_slots() { batch_job slots; }
horovod_hosts() { batch_job horovod_hosts; }

# Plans task $2 as a task of kind $1 (tf_resnet/jobs/tasks.py: single,
# ranks, workers or async), in the repository, after the job's first line,
# what it reads; exits 2 where that is missing. Sets RUN_DIR, JOB_SCRIPT,
# STEP_STATUS (a job step's exit codes, see run_job_command), the async
# task's SERVER_ADDRESSES (host:port,...) and SERVER_LAUNCH, and PLAN, the
# command.
plan_task() {
  local out
  cd "$REPO"
  out=$(batch_job plan "$@") || exit
  mapfile -t PLAN <<<"$out"
  RUN_DIR=${PLAN[0]} JOB_SCRIPT=${PLAN[1]} STEP_STATUS=${PLAN[2]}
  SERVER_ADDRESSES=${PLAN[3]}
  SERVER_LAUNCH=("${PLAN[@]:5:${PLAN[4]}}")
  PLAN=("${PLAN[@]:5+${PLAN[4]}}")
  requeue_without_gpus
}

# Slurm 21.08 to 23.02.1 may start a requeued job without the GPUs it asked
# for (docs/reliability.md), and then no job step that needs them starts:
# such a job requeues itself once more, which gets them, counted among
# MAX_REQUEUES; past those it ends here with an error line.
requeue_without_gpus() {
  local code=0
  batch_job without_gpus || code=$?
  case $code in
    0)
      requeue_job
      exit 0
      ;;
    1) ;;
    *) exit 1 ;;
  esac
}

# A single-node task: one resnet_main.py process on the node's GPUs.
train_single() {
  plan_task single "$1"
  run_job_command "${PLAN[@]}"
}

# Synchronous all-reduce: one process per task slot, on every node, with
# the engine ENGINE names: Horovod ranks started by LAUNCHER, or
# multi_worker workers (under PBS without aprun: `pbs_workers`).
train_sync() {
  case ${ENGINE:-horovod} in
    horovod) plan_task ranks "$1" ;;
    multi_worker) plan_task workers "$1" ;;
    *)
      log "error: ENGINE=$ENGINE: expected horovod or multi_worker"
      return 2
      ;;
  esac
  if [[ ${PLAN[0]} == pbs_workers ]]; then
    "${PLAN[@]}"
  else
    run_job_command "${PLAN[@]}"
  fi
}

# Workers 0..$1-1 of the rest of the arguments, each started by pbsdsh -n i
# with --task_index=i; returns the first failed worker's exit code.
pbs_workers() {
  local count=$1 i workers=() code=0
  shift
  for ((i = 0; i < count; i++)); do
    pbsdsh -n "$i" -- /bin/bash -c 'cd "$1" && shift && exec "$@"' \
      task "$REPO" "$@" --task_index="$i" &
    workers+=($!)
  done
  # A stop signal goes to every worker (each checkpoints its part); a
  # failed worker stops the others, whose collectives would wait for it.
  STOPPED=""
  trap 'STOPPED=TERM; kill -TERM "${workers[@]}" 2>/dev/null' TERM
  trap 'STOPPED=INT; kill -TERM "${workers[@]}" 2>/dev/null' INT
  local pid status alive
  while ((${#workers[@]})); do
    alive=()
    for pid in "${workers[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then
        alive+=("$pid")
        continue
      fi
      wait "$pid" && continue
      status=$?
      if ((!code)); then
        code=$status
        [[ -n $STOPPED ]] && continue
        log "error: a worker exited with code $code; stopping the others"
        kill -TERM "${workers[@]}" 2>/dev/null || true
      fi
    done
    workers=(${alive[@]+"${alive[@]}"})
    if ((${#workers[@]})); then sleep 1 || true; fi
  done
  record_stop_signals
  if [[ -n $STOPPED ]]; then
    report_stop
  else
    log "workers exited, code $code"
  fi
  return "$code"
}

# Asynchronous SGD: task slots 0..NUM_PS-1 are parameter servers, the others
# workers; the coordinator runs here, in the batch shell on the first node.
train_async() {
  local code=0
  SERVERS=()  # The srun, aprun or pbsdsh processes that started the servers.
  REQUEUE=0 STOPPED=""
  plan_task async "$1"
  start_servers
  # Until every server accepts connections (START_TIMEOUT, default 300 s):
  # the coordinator would fail on one that is not up yet.
  batch_job wait_for_servers "$SERVER_ADDRESSES" "${SERVERS[@]}" || code=$?
  if ((code == 0)); then
    "${PLAN[@]}" &
    watch_coordinator $! || code=$?
  fi
  # The servers serve until killed; the scheduler also ends any task of the
  # job that is left when this script exits.
  log "stopping the ps and worker servers; they serve until killed, so" \
    "the launcher reports them killed"
  stop_servers
  coordinator_ended "$code"
}

# The async job's last line: its requeue, where a stop left the run, or the
# coordinator's exit code $1 (returned) and what it means.
coordinator_ended() {
  local code=$1
  if ((REQUEUE)); then
    requeue_job
  elif [[ -n $STOPPED ]]; then
    report_stop
  elif ((code)); then
    log "error: the coordinator exited with code $code:" \
      "$(batch_job exit_cause "$code")"
  else
    log "coordinator exited with code 0"
  fi
  return "$code"
}

# Starts a ps or worker server on each task slot (SERVER_ADDRESSES) and
# adds their launchers to SERVERS: srun or aprun (SERVER_LAUNCH) once, else
# pbsdsh per slot, with the slot's index last.
start_servers() {
  local i addresses
  if [[ ${SERVER_LAUNCH[0]} != pbsdsh ]]; then
    "${SERVER_LAUNCH[@]}" &
    SERVERS+=($!)
    return
  fi
  IFS=, read -ra addresses <<<"$SERVER_ADDRESSES"
  for ((i = 0; i < ${#addresses[@]}; i++)); do
    pbsdsh -n "$i" -- "${SERVER_LAUNCH[@]:1}" "$i" &
    SERVERS+=($!)
  done
}

# Waits for the coordinator (pid $1); returns its exit code. A stop signal
# to the job is passed on to it (SIGTERM: it writes a checkpoint and
# exits). A server that exits stops it too: TensorFlow's coordinator would
# wait for a lost worker until the job's time limit. If it has not exited
# STOP_TIMEOUT seconds (default 120) after SIGTERM, it is killed. Sets
# STOPPED (the stop signal's name) and REQUEUE (the time limit's warning).
watch_coordinator() {
  local coordinator=$1 stop_at=0
  REQUEUE=0 STOPPED=""
  trap 'STOPPED=TERM; stop_coordinator' TERM
  trap 'STOPPED=INT; stop_coordinator' INT
  trap 'time_limit_near; ((stop_at)) || stop_at=$SECONDS' USR1
  while kill -0 "$coordinator" 2>/dev/null; do
    if ((!stop_at)) && ! servers_alive; then
      log "error: a server task exited; stopping the coordinator"
      kill -TERM "$coordinator" 2>/dev/null
      stop_at=$SECONDS
    elif ((stop_at && SECONDS - stop_at > ${STOP_TIMEOUT:-120})); then
      log "the coordinator still runs ${STOP_TIMEOUT:-120}s later; killing it"
      kill -KILL "$coordinator" 2>/dev/null
    fi
    sleep 2 || true # The stop signal ends sleep too (and set -e the job).
  done
  record_stop_signals
  local code=0
  wait "$coordinator" || code=$?
  return "$code"
}

# SIGTERM to the coordinator of watch_coordinator, whose locals it sets.
stop_coordinator() {
  kill -TERM "$coordinator" 2>/dev/null || true
  ((stop_at)) || stop_at=$SECONDS
}

# Ends the launchers of the servers (srun ends its tasks), with SIGKILL 10
# seconds later: a job being cancelled has its steps already ending, and
# srun waits for them past the job's kill wait, which would kill this
# shell before it says where the run stopped.
stop_servers() {
  local waited=0
  kill "${SERVERS[@]}" 2>/dev/null || true
  while servers_running && ((waited++ < 10)); do sleep 1 || true; done
  kill -KILL "${SERVERS[@]}" 2>/dev/null || true
  wait "${SERVERS[@]}" 2>/dev/null || true
}

servers_running() {
  local pid
  for pid in "${SERVERS[@]}"; do
    kill -0 "$pid" 2>/dev/null && return 0
  done
  return 1
}

servers_alive() {
  local pid
  for pid in "${SERVERS[@]}"; do
    kill -0 "$pid" 2>/dev/null || return 1
  done
}


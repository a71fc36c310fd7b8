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
#                (tf_resnet/launch/batch_job.py: standard library only;
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
#                exit 4) requeues itself (default 2)
#   MW_PORT      sync task, multi_worker: task i listens on MW_PORT + i
#                (default: the job's base port, see job_port in
#                tf_resnet/launch/batch_job.py)
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
DATA_ROOT=${DATA_ROOT:-$REPO/datasets}
# The run directory and the script that submits the task again, once known
# (`check_task_data`); the signal that stopped the job, if one did.
RUN_DIR="" JOB_SCRIPT="" STOPPED=""
read -ra EXTRA <<<"${EXTRA_FLAGS:-}"
# ${a[@]+"${a[@]}"}: an empty array, which bash before 4.4 calls unbound
# under set -u.

log() { echo "$(date -u +%H:%M:%S) course_job: $*" >&2; }

# The job's decisions and messages: tf_resnet/launch/batch_job.py of the
# checkout this file is in (standard library only, no TensorFlow), run by
# BATCH_PYTHON with the shell's variables. It logs its own lines; what it
# prints is read back, a value a line. It ignores the stop signals, which
# qdel sends to every process of the job: killed, it would fail, and set
# -e end the job before it says where the run stopped.
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
    exec "$BATCH_PYTHON" -S -m tf_resnet.launch.batch_job "$@"
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
# preemption; qdel), and the
# training processes agree on the step to stop at among themselves. SIGUSR1,
# the time limit's warning, stops the training the same way and requeues
# the job once it has exited. With STEP_STATUS set (a job step started by
# `step_command`), a failed task ends the step STEP_GRACE seconds later and
# a lost task requeues the job. Returns the command's exit code, or the
# failed task's.
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
    if ((code == 4)); then requeue_after_lost_task; fi
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

# The shell every task or rank runs: in $1 (REPO), the rest of its
# arguments, with --task_index=<its rank> where $3 is set, its exit code
# then written to $2/<its rank> (see run_job_command). The rank is the
# launcher's: Horovod's, Open MPI's, MPICH's, PMIx's, Cray ALPS's, else the
# Slurm task's.
# It traps SIGTERM, which the scheduler sends to every process of the job,
# so that it outlives the training process's checkpoint and records its
# code.
TASK_SHELL='trap : TERM; cd "$1" && status=$2 index=$3 && shift 3
  rank=${HOROVOD_RANK:-${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}}
  "$@" ${index:+--task_index="$rank"}; code=$?
  echo "$code" >"$status/$rank"; exit "$code"'

# Sets STEP to srun's command line for a job step of $2 tasks, one per
# task slot, with Slurm's MPI plugin $1 (none for TensorFlow's own workers,
# even where the cluster's MpiDefault is an MPI). Each task runs the rest of
# the arguments in TASK_SHELL, with --task_index=<its rank> where the first
# argument is --task_index. No --kill-on-bad-exit: srun would have Slurm
# signal the step on every node, and where a node is lost that signal
# waits in Slurm's queue until the node is back, then stops the requeued
# job's step of the same number; run_job_command ends the step itself.
step_command() {
  local mpi=$1 tasks=$2 index=""
  shift 2
  if [[ $1 == --task_index ]]; then index=1 && shift; fi
  STEP_STATUS=$(batch_job step_dir)
  STEP=(srun --ntasks="$tasks" --distribution=block --mpi="$mpi" /bin/bash
    -c "$TASK_SHELL" task "$REPO" "$STEP_STATUS" "$index" "$@")
}

# Sets RANK to the rest of the arguments as one rank of horovodrun or
# mpirun, in TASK_SHELL: its exit code is kept, where the launcher would
# exit 1 for any failed rank.
rank_command() {
  STEP_STATUS=$(batch_job step_dir)
  RANK=(/bin/bash -c "$TASK_SHELL" rank "$REPO" "$STEP_STATUS" "" "$@")
}

# A task lost its peers (a node or a process of the step gone): what a
# requeue fixes, from the last checkpoint, up to MAX_REQUEUES times.
requeue_after_lost_task() {
  if batch_job lost_task; then REQUEUE=1; fi
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
# send it: those started by this shell, and (Slurm) the tasks of its job
# steps. Not to srun: srun ends its tasks with SIGKILL on SIGTERM.
stop_training() {
  local pid args
  for pid in $(descendants $$); do
    args=()
    { mapfile -d '' -t args <"/proc/$pid/cmdline"; } 2>/dev/null || continue
    # `python resnet_main.py ...` itself, not a launcher naming it.
    if [[ ${args[1]:-} == *resnet_main.py ]]; then
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  if [[ $SCHEDULER == slurm ]]; then
    scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null || true
  fi
}

descendants() {
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}

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

# Sets RUN_DIR, JOB_SCRIPT (the script that submits task $1 again) and
# FLAGS (its data, run directory and weights) after the job's first line,
# what it reads; exits 2 where that is missing.
check_task_data() {
  local out
  out=$(batch_job task "$1") || exit
  mapfile -t FLAGS <<<"$out"
  RUN_DIR=${FLAGS[0]} JOB_SCRIPT=${FLAGS[1]}
  FLAGS=("${FLAGS[@]:2}")
}

# need_data PATH DOWNLOAD_FLAGS VARIABLES: one error line and exit 2 (bad
# input, as resnet_main's) when PATH, a file, folder or glob, matches
# nothing; it names the download that fetches it and the variables.
need_data() { batch_job need_data "$@" || exit; }

# One line per task slot of the allocation, its host, in task order; and
# horovodrun's -H (host1:4,host2:4).
job_slots() { batch_job slots; }
horovod_hosts() { batch_job horovod_hosts; }

# A single-node task: one resnet_main.py process on the node's GPUs
# (--num_gpus: one process uses only the GPUs it is asked to); under
# LAUNCHER=aprun on a compute node, `aprun -n 1 -N 1`, which counts its
# GPUs there (NODE_GPUS).
train_single() {
  local preset=$1 gpus launch
  check_task_data "$preset"
  launch=$(batch_job aprun 1) || exit
  local command=("$PYTHON" resnet_main.py --preset="$preset" "${FLAGS[@]}")
  cd "$REPO"
  if [[ -n $launch ]]; then
    mapfile -t launch <<<"$launch"
    log "$preset on the compute nodes: ${launch[*]}"
    run_job_command "${launch[@]}" /bin/bash -c "$NODE_GPUS" task "$REPO" \
      "${command[@]}" ${EXTRA[@]+"${EXTRA[@]}"}
    return
  fi
  gpus=$(batch_job gpus)
  log "$preset on $(hostname)"
  run_job_command "${command[@]}" --num_gpus="$gpus" ${EXTRA[@]+"${EXTRA[@]}"}
}

# The shell aprun runs a one-node task in: in $1 (REPO), the rest of its
# arguments, `python script`, then --num_gpus=<the node's GPUs>, then the
# flags (so that EXTRA_FLAGS' --num_gpus wins). ALPS gives a job whole
# nodes, so every GPU of the node (a /dev/nvidiaN each) is the job's; the
# batch shell's node, a service node, cannot say how many.
NODE_GPUS='cd "$1" && shift && gpus=(/dev/nvidia[0-9]*)
  [[ -e ${gpus[0]} ]] || gpus=()
  exec "$1" "$2" --num_gpus="${#gpus[@]}" "${@:3}"'

# Synchronous all-reduce: one process per task slot, on every node, with
# the engine ENGINE names.
train_sync() {
  check_task_data "$1"
  case ${ENGINE:-horovod} in
    horovod) train_sync_horovod "$@" ;;
    multi_worker) train_sync_multi_worker "$@" ;;
    *)
      log "error: ENGINE=$ENGINE: expected horovod or multi_worker"
      return 2
      ;;
  esac
}

# One Horovod rank per task slot, started by LAUNCHER: horovodrun (ssh and
# Gloo), srun (Slurm's PMIx or PMI2 and Horovod's MPI), mpirun (the MPI's
# own launcher) or aprun (Cray ALPS, as the course's `aprun -n N -N 1`).
# The launcher's command line is batch_job's (`horovod_launcher`).
train_sync_horovod() {
  local preset=$1 launch
  launch=$(batch_job launcher "$preset") || return
  mapfile -t launch <<<"$launch"
  local command=("$PYTHON" resnet_main.py --preset="$preset" "${FLAGS[@]}"
    ${EXTRA[@]+"${EXTRA[@]}"})
  cd "$REPO"
  if [[ ${launch[0]} == srun ]]; then
    step_command "${launch[1]}" "${launch[2]}" "${command[@]}"
    run_job_command "${STEP[@]}"
  else
    if [[ ${launch[0]} == aprun ]]; then
      log "ranks on the compute nodes: ${launch[*]}"
    fi
    rank_command "${command[@]}"
    run_job_command "${launch[@]}" "${RANK[@]}"
  fi
}

# One --distribution=multi_worker worker per task slot (TensorFlow's
# MultiWorkerMirroredStrategy: no Horovod, no ssh), started by srun, by
# aprun (LAUNCHER=aprun: a PE per slot of `placed_slots`) or by pbsdsh -n
# i. Slot i listens on MW_PORT + i; slot 0 is the chief.
train_sync_multi_worker() {
  local preset=$1 plan count hosts launch
  plan=$(batch_job workers)  # How many, and their host:port list.
  mapfile -t plan <<<"$plan"
  count=${plan[0]} hosts=${plan[1]}
  cd "$REPO"
  log "$preset: $count multi_worker workers at $hosts"
  # Everything as arguments (pbsdsh passes no environment), the engine's
  # flags last so that they win over EXTRA_FLAGS; each task first enters
  # the repository (pbsdsh starts tasks in $HOME).
  local command=("$PYTHON" resnet_main.py --preset="$preset" "${FLAGS[@]}"
    ${EXTRA[@]+"${EXTRA[@]}"} --distribution=multi_worker
    --worker_hosts="$hosts")
  if [[ $SCHEDULER == slurm ]]; then
    # One task per slot, its index from SLURM_PROCID; the step ends when
    # one fails.
    step_command none "$count" --task_index "${command[@]}"
    run_job_command "${STEP[@]}"
    return
  fi
  launch=$(batch_job aprun) || return
  if [[ -n $launch ]]; then
    # One PE per worker, its index from ALPS_APP_PE (TASK_SHELL).
    mapfile -t launch <<<"$launch"
    log "workers on the compute nodes: ${launch[*]}"
    STEP_STATUS=$(batch_job step_dir)
    run_job_command "${launch[@]}" /bin/bash -c "$TASK_SHELL" task "$REPO" \
      "$STEP_STATUS" 1 "${command[@]}"
    return
  fi
  pbs_workers "$count" "${command[@]}"
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
  local preset=$1 plan count ps_hosts worker_hosts code=0
  SERVERS=()  # The srun or pbsdsh processes that started the servers.
  check_task_data "$preset"
  # The task slots, and the addresses of the servers and of the workers.
  plan=$(batch_job servers) || return
  mapfile -t plan <<<"$plan"
  count=${plan[0]} ps_hosts=${plan[1]} worker_hosts=${plan[2]}
  cd "$REPO"
  log "$preset: ps $ps_hosts, workers $worker_hosts"
  start_servers "$count" "$ps_hosts" "$worker_hosts"
  local addresses
  IFS=, read -ra addresses <<<"$ps_hosts,$worker_hosts"
  wait_for_servers "${addresses[@]}" || code=$?
  if ((code == 0)); then
    "$PYTHON" resnet_main.py --preset="$preset" --ps_hosts="$ps_hosts" \
      --worker_hosts="$worker_hosts" "${FLAGS[@]}" \
      ${EXTRA[@]+"${EXTRA[@]}"} &
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

# Starts a ps or worker server on each of the $1 task slots, given the
# --ps_hosts $2 and --worker_hosts $3, and adds their launchers to SERVERS:
# srun, one aprun (LAUNCHER=aprun: a PE per task, its index from
# ALPS_APP_PE), else pbsdsh per slot.
start_servers() {
  local count=$1 i launch
  # The servers get everything as arguments: pbsdsh passes no environment.
  local task=("$REPO/scripts/ps_task.sh" "$PYTHON" "$REPO" "$2" "$3")
  if [[ $SCHEDULER == slurm ]]; then
    # One task per slot; ps_task.sh takes its index from SLURM_PROCID.
    srun --ntasks="$count" --distribution=block --kill-on-bad-exit=1 \
      --mpi=none "${task[@]}" &
    SERVERS+=($!)
    return
  fi
  launch=$(batch_job aprun) || exit
  if [[ -n $launch ]]; then
    mapfile -t launch <<<"$launch"
    log "ps and worker servers on the compute nodes: ${launch[*]}"
    "${launch[@]}" "${task[@]}" &
    SERVERS+=($!)
    return
  fi
  for ((i = 0; i < count; i++)); do
    pbsdsh -n "$i" -- "${task[@]}" "$i" &
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

# Returns once every host:port accepts connections (the coordinator would
# fail on a server that is not up yet); 1 after START_TIMEOUT seconds or
# when a process of SERVERS has exited.
wait_for_servers() {
  local deadline=$((SECONDS + ${START_TIMEOUT:-300})) address
  for address in "$@"; do
    until timeout 5 bash -c ': <"/dev/tcp/$1/$2"' _ "${address%:*}" \
      "${address##*:}" 2>/dev/null; do
      if ! servers_alive; then
        log "error: a server task exited before serving (see above)"
        return 1
      fi
      if ((SECONDS > deadline)); then
        log "error: no server at $address after ${START_TIMEOUT:-300}s"
        return 1
      fi
      sleep 1
    done
  done
}

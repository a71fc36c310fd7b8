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
#                `aprun -n N -N RANKS_PER_NODE`, Horovod on Cray MPICH)
#   RANKS_PER_NODE  LAUNCHER=aprun: ranks on each node (default: the node's
#                task slots in $PBS_NODEFILE); the course's `aprun -n 2 -N 1`
#                on `nodes=2:ppn=16:xk` is RANKS_PER_NODE=1
#   APRUN_FLAGS  LAUNCHER=aprun: extra aprun flags (e.g. "-d 16 -cc none")
#   SRUN_MPI     LAUNCHER=srun: Slurm's MPI plugin (default pmix)
#   HOROVOD_FLAGS  sync task, horovod: extra horovodrun flags
#                (e.g. "--network-interface ib0")
#   MAX_REQUEUES Slurm: how often a job whose step lost a task (a node gone:
#                exit 4) requeues itself (default 2)
#   MW_PORT      sync task, multi_worker: task i listens on MW_PORT + i
#                (default: the job's base port, see job_port)
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
# (`set_run_dir`); the signal that stopped the job, if one did.
RUN_DIR="" JOB_SCRIPT="" STOPPED=""
read -ra EXTRA <<<"${EXTRA_FLAGS:-}"
# ${a[@]+"${a[@]}"}: an empty array, which bash before 4.4 calls unbound
# under set -u.

log() { echo "$(date -u +%H:%M:%S) course_job: $*" >&2; }

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
  local code=0 failed_at=0 failed=""
  REQUEUE=0 STOPPED=""
  "$@" &
  JOB_COMMAND=$!
  record_stop_signals
  trap 'time_limit_near' USR1
  while kill -0 "$JOB_COMMAND" 2>/dev/null; do
    if [[ -n ${STEP_STATUS:-} ]] && ((!failed_at)); then
      failed=$(failed_task)
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
  wait "$JOB_COMMAND" || code=$?
  record_stop_signals
  if [[ -n ${STEP_STATUS:-} ]]; then
    failed=$(failed_task) # Every task that exited has written its code.
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
    log "error: task ${failed% *} exited with code $code: $(exit_cause "$code")"
  fi
  return "$code"
}

# A stop signal only sets STOPPED, during the training and after it (Slurm
# may send SIGTERM more than once): the shell lives to say where the run
# stopped. Turns the time limit's warning off.
record_stop_signals() {
  trap 'STOPPED=TERM' TERM
  trap 'STOPPED=INT' INT
  trap - USR1
}

# What resnet_main's exit code $1 says went wrong.
exit_cause() {
  case $1 in
    2) echo "bad flags or data (its error: line above names them)" ;;
    3) echo "the training diverged (its error: line above names the step)" ;;
    4) echo "it lost a peer: a node or a process of the job is gone" ;;
    *) echo "see its output above" ;;
  esac
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
  STEP_STATUS=$(step_status_dir)
  STEP=(srun --ntasks="$tasks" --distribution=block --mpi="$mpi" /bin/bash
    -c "$TASK_SHELL" task "$REPO" "$STEP_STATUS" "$index" "$@")
}

# Sets RANK to the rest of the arguments as one rank of horovodrun or
# mpirun, in TASK_SHELL: its exit code is kept, where the launcher would
# exit 1 for any failed rank.
rank_command() {
  STEP_STATUS=$(step_status_dir)
  RANK=(/bin/bash -c "$TASK_SHELL" rank "$REPO" "$STEP_STATUS" "" "$@")
}

# A fresh folder for the exit codes of this run of the job: on the shared
# file system (the tasks run on other nodes), beside the job's output.
step_status_dir() {
  local dir=${SLURM_SUBMIT_DIR:-$PWD}/.tf-resnet-steps/$(job_id).${SLURM_RESTART_COUNT:-0}
  rm -rf "$dir" && mkdir -p "$dir"
  echo "$dir"
}

# "<task> <code>" of the first task of the step that exited non-zero,
# preferring one that failed of itself to one that lost its peers (4): the
# others of a job whose task failed exit 4.
failed_task() {
  local file code lost=""
  for file in "$STEP_STATUS"/*; do
    [[ -f $file ]] || continue
    code=$(<"$file")
    if [[ $code == 4 ]]; then
      lost=${lost:-"$(basename "$file") $code"}
    elif [[ -n $code && $code != 0 ]]; then
      echo "$(basename "$file") $code"
      return
    fi
  done
  if [[ -n $lost ]]; then echo "$lost"; fi
}

# A task lost its peers (a node or a process of the step gone): what a
# requeue fixes, from the last checkpoint, up to MAX_REQUEUES times.
requeue_after_lost_task() {
  local restarts=${SLURM_RESTART_COUNT:-0}
  if [[ $SCHEDULER != slurm ]]; then return; fi
  if ((restarts >= ${MAX_REQUEUES:-2})); then
    log "a task lost its peers again; restarted $restarts times already" \
      "(MAX_REQUEUES=${MAX_REQUEUES:-2}): not requeueing"
    return
  fi
  log "a task lost its peers (exit 4): requeueing, restart $((restarts + 1))" \
    "of at most ${MAX_REQUEUES:-2}"
  REQUEUE=1
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
  log "requeueing job $SLURM_JOB_ID; it resumes from $(newest_checkpoint)"
  scontrol requeue "$SLURM_JOB_ID"
}

# The job's last line after a stop signal (scancel, preemption, a requeue,
# qdel): where the run stopped and how it goes on. The training processes
# say so too, but a launcher may drop their last lines (horovodrun ends the
# ssh sessions of other nodes' ranks on SIGTERM), so the job says it from
# what is on disk. RUN_DIR is the run directory (`set_run_dir`).
report_stop() {
  local how="LOG_ROOT=$RUN_DIR sbatch $JOB_SCRIPT"
  if [[ $SCHEDULER == pbs ]]; then how="qsub -v LOG_ROOT=$RUN_DIR $JOB_SCRIPT"; fi
  log "stopped${STOPPED:+ by SIG$STOPPED}; the newest checkpoint:" \
    "$(newest_checkpoint)"
  log "to resume there, submit it again from the repository with the same" \
    "LOG_ROOT: $how (a job the scheduler requeues resumes by itself)"
}

# "step N (DIR/ckpt-N)" for the run's newest checkpoint, from
# TensorFlow's `checkpoint` index in RUN_DIR; "none" before the first.
newest_checkpoint() {
  local index=${RUN_DIR:-}/checkpoint name
  name=$(sed -n 's/^model_checkpoint_path: "\(.*\)"$/\1/p' "$index" \
    2>/dev/null) || true
  if [[ -z $name ]]; then
    echo "none in ${RUN_DIR:-the run directory}, so it starts over"
    return
  fi
  name=${name##*/}
  echo "step ${name##*-} ($RUN_DIR/$name)"
}

# RUN_DIR, the run directory of task $1 (LOG_ROOT, else $HOME/runs/<task>-
# <job id>, so a requeued job, whose id is kept, resumes; a --log_root in
# EXTRA_FLAGS wins, as it does on resnet_main's command line), and
# JOB_SCRIPT, the script that submits the task again.
set_run_dir() {
  local flag extension=sbatch
  RUN_DIR=${LOG_ROOT:-$HOME/runs/$1-$(job_id)}
  for flag in ${EXTRA[@]+"${EXTRA[@]}"}; do
    if [[ $flag == --log_root=* ]]; then RUN_DIR=${flag#*=}; fi
  done
  if [[ $SCHEDULER == pbs ]]; then extension=pbs; fi
  JOB_SCRIPT=scripts/$SCHEDULER/$1.$extension
}

job_id() {
  if [[ $SCHEDULER == slurm ]]; then
    echo "$SLURM_JOB_ID"
  else
    echo "${PBS_JOBID%%.*}"
  fi
}

# One line per task slot of the allocation, its host, in task order.
job_slots() {
  if [[ $SCHEDULER == pbs ]]; then
    cat "$PBS_NODEFILE"  # Each host once per slot (ppn), in order.
    return
  fi
  # SLURM_TASKS_PER_NODE reads like "4(x2),2": 4 tasks on each of the
  # first two hosts, then 2.
  local hosts counts=() item count times i k
  mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
  IFS=, read -ra items <<<"$SLURM_TASKS_PER_NODE"
  for item in "${items[@]}"; do
    count=${item%%(*}
    times=1
    if [[ $item == *x* ]]; then
      times=${item#*x}
      times=${times%)}
    fi
    for ((k = 0; k < times; k++)); do counts+=("$count"); done
  done
  for i in "${!hosts[@]}"; do
    for ((k = 0; k < counts[i]; k++)); do echo "${hosts[i]}"; done
  done
}

# horovodrun's -H: host1:4,host2:4, each host with its slots, in
# allocation order.
horovod_hosts() {
  job_slots | awk '!n[$1]++ { order[++k] = $1 } END {
    for (i = 1; i <= k; i++) printf "%s%s:%d", (i > 1 ? "," : ""),
      order[i], n[order[i]] }'
}

# The first port of this job's servers: 10000 + 100 * (job id mod 200), so
# that jobs sharing a node listen on ports of their own (up to 100 task
# slots). A fixed port is not enough: TensorFlow's gRPC servers bind with
# SO_REUSEPORT, so a second job's server on the same port starts without an
# error and the two jobs' processes reach each other's servers. The ports
# stay below 32768, where Linux's default range for outgoing connections
# starts: a server there can find its port taken by any connection.
job_port() {
  local id
  id=$(job_id)
  echo $((10000 + 100 * (${id//[^0-9]/} % 200)))
}

# host:port of each task slot, in slot order: slot i listens on port $1+i.
slot_addresses() {
  local port=$1 slots i
  mapfile -t slots < <(job_slots)
  for i in "${!slots[@]}"; do echo "${slots[i]}:$((port + i))"; done
}

# A task's training path, evaluation path and download.py's flag for them,
# one a line (a path may hold spaces).
task_data() {
  case $1 in
    course_tinyimagenet)
      printf '%s\n' "${TRAIN_DATA:-$DATA_ROOT/tiny-imagenet-200}" \
        "${EVAL_DATA:-$DATA_ROOT/tiny-imagenet-200}" --dataset=tinyimagenet
      ;;
    *)
      printf '%s\n' "${TRAIN_DATA:-$DATA_ROOT/cifar-100-binary/train.bin}" \
        "${EVAL_DATA:-$DATA_ROOT/cifar-100-binary/test.bin}" --dataset=cifar100
      ;;
  esac
}

# The weights resnet18_cifar100 starts from.
task_weights() {
  echo "${PRETRAINED:-$REPO/weights/resnet18-f37072fd.pth}"
}

# need_data PATH DOWNLOAD_FLAGS VARIABLES: one error line and exit 2 (bad
# input, as resnet_main's) when PATH, a file, folder or glob, matches
# nothing; it names PATH, the download that fetches it and the variables
# that point elsewhere.
need_data() {
  compgen -G "$1" >/dev/null && return 0
  log "error: $1: no such file or folder; download it first:" \
    "$PYTHON $REPO/data/download.py $2 (or set $3)"
  exit 2
}

# The job's first line: what it reads; then the check that it is there.
check_task_data() {
  local preset=$1 data
  set_run_dir "$preset"
  mapfile -t data < <(task_data "$preset")
  log "$preset reads: train ${data[0]}, eval ${data[1]} (DATA_ROOT=$DATA_ROOT)"
  local variables="DATA_ROOT, or TRAIN_DATA and EVAL_DATA"
  need_data "${data[0]}" "${data[2]} --output_dir=$DATA_ROOT" "$variables"
  need_data "${data[1]}" "${data[2]} --output_dir=$DATA_ROOT" "$variables"
  if [[ $preset == resnet18_cifar100 ]]; then
    need_data "$(task_weights)" --weights=resnet18 PRETRAINED
  fi
}

# The flags of a task: its data, run directory and weights.
task_flags() {
  local data
  mapfile -t data < <(task_data "$1")
  echo "--train_data_path=${data[0]}"
  echo "--eval_data_path=${data[1]}"
  echo "--log_root=$RUN_DIR"
  if [[ $1 == resnet18_cifar100 ]]; then
    echo "--pretrained=$(task_weights)"
  fi
}

# The GPUs the scheduler gave this node: Slurm's count, else the devices
# CUDA_VISIBLE_DEVICES lists, else Torque's $PBS_GPUFILE (one line per GPU
# of the job, as host-gpuN), else none.
gpus_on_node() {
  local ids
  if [[ -n ${SLURM_GPUS_ON_NODE:-} ]]; then
    echo "$SLURM_GPUS_ON_NODE"
  elif [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
    echo "${#ids[@]}"
  elif [[ -n ${PBS_GPUFILE:-} && -f $PBS_GPUFILE ]]; then
    grep -c "^$(hostname)-gpu" "$PBS_GPUFILE" || true
  else
    echo 0
  fi
}

# A single-node task: one resnet_main.py process on the node's GPUs
# (--num_gpus: one process uses only the GPUs it is asked to).
train_single() {
  local preset=$1 flags
  check_task_data "$preset"
  mapfile -t flags < <(task_flags "$preset")
  cd "$REPO"
  log "$preset on $(hostname)"
  run_job_command "$PYTHON" resnet_main.py --preset="$preset" "${flags[@]}" \
    --num_gpus="$(gpus_on_node)" ${EXTRA[@]+"${EXTRA[@]}"}
}

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
train_sync_horovod() {
  local preset=$1 flags hosts ranks horovod_flags per_node
  mapfile -t flags < <(task_flags "$preset")
  read -ra horovod_flags <<<"${HOROVOD_FLAGS:-}"
  hosts=$(horovod_hosts)
  ranks=$(job_slots | wc -l)
  if [[ ${LAUNCHER:-} == aprun ]]; then
    # aprun -N: ranks per node, RANKS_PER_NODE or the first node's slots.
    per_node=${RANKS_PER_NODE:-$(job_slots | uniq -c | awk 'NR == 1 {
      print $1 }')}
    hosts=$(job_slots | uniq | sed "s/\$/:$per_node/" | paste -sd,)
    ranks=$(($(job_slots | uniq | wc -l) * per_node))
  fi
  local command=("$PYTHON" resnet_main.py --preset="$preset" "${flags[@]}"
    ${EXTRA[@]+"${EXTRA[@]}"})
  cd "$REPO"
  log "$preset: $ranks ranks on $hosts (${LAUNCHER:-horovodrun})"
  case ${LAUNCHER:-horovodrun} in
    horovodrun)
      # horovodrun starts the ranks of other hosts over ssh.
      rank_command "${command[@]}"
      run_job_command ignoring_term "$(dirname "$PYTHON")/horovodrun" \
        -np "$ranks" -H "$hosts" --gloo \
        ${horovod_flags[@]+"${horovod_flags[@]}"} "${RANK[@]}"
      ;;
    srun)
      if [[ $SCHEDULER != slurm ]]; then
        log "error: LAUNCHER=srun needs Slurm; use mpirun or horovodrun"
        return 2
      fi
      step_command "${SRUN_MPI:-pmix}" "$ranks" "${command[@]}"
      run_job_command "${STEP[@]}"
      ;;
    mpirun)
      # Open MPI and MPICH read Slurm's allocation; under PBS without TM
      # support they need the node file.
      local hostfile=()
      if [[ $SCHEDULER == pbs ]]; then hostfile=(-hostfile "$PBS_NODEFILE"); fi
      rank_command "${command[@]}"
      run_job_command ignoring_term mpirun -np "$ranks" \
        ${hostfile[@]+"${hostfile[@]}"} "${RANK[@]}"
      ;;
    aprun)
      # The batch shell runs on a service node; aprun places the ranks on
      # the compute nodes, RANKS_PER_NODE on each, and passes SIGTERM on.
      if [[ $SCHEDULER != pbs ]]; then
        log "error: LAUNCHER=aprun is Cray ALPS under PBS; under Slurm use srun"
        return 2
      fi
      local aprun_flags
      read -ra aprun_flags <<<"${APRUN_FLAGS:-}"
      rank_command "${command[@]}"
      run_job_command aprun -n "$ranks" -N "$per_node" \
        ${aprun_flags[@]+"${aprun_flags[@]}"} "${RANK[@]}"
      ;;
    *)
      log "error: LAUNCHER=$LAUNCHER: expected horovodrun, srun, mpirun or aprun"
      return 2
      ;;
  esac
}

# One --distribution=multi_worker worker per task slot (TensorFlow's
# MultiWorkerMirroredStrategy: no Horovod, no ssh), started by srun or by
# pbsdsh -n i. Slot i listens on MW_PORT + i; slot 0 is the chief.
train_sync_multi_worker() {
  local preset=$1 flags addresses hosts i workers=() code=0
  mapfile -t flags < <(task_flags "$preset")
  mapfile -t addresses < <(slot_addresses "${MW_PORT:-$(job_port)}")
  hosts=$(IFS=,; echo "${addresses[*]}")
  cd "$REPO"
  log "$preset: ${#addresses[@]} multi_worker workers at $hosts"
  # Everything as arguments (pbsdsh passes no environment), the engine's
  # flags last so that they win over EXTRA_FLAGS; each task first enters
  # the repository (pbsdsh starts tasks in $HOME).
  local command=("$PYTHON" resnet_main.py --preset="$preset" "${flags[@]}"
    ${EXTRA[@]+"${EXTRA[@]}"} --distribution=multi_worker
    --worker_hosts="$hosts")
  if [[ $SCHEDULER == slurm ]]; then
    # One task per slot, its index from SLURM_PROCID; the step ends when
    # one fails.
    step_command none "${#addresses[@]}" --task_index "${command[@]}"
    run_job_command "${STEP[@]}"
    return
  fi
  for i in "${!addresses[@]}"; do
    pbsdsh -n "$i" -- /bin/bash -c 'cd "$1" && shift && exec "$@"' \
      task "$REPO" "${command[@]}" --task_index="$i" &
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
  local preset=$1 flags num_ps=${NUM_PS:-1} addresses ps_hosts worker_hosts
  local i code=0
  SERVERS=()  # The srun or pbsdsh processes that started the servers.
  check_task_data "$preset"
  mapfile -t flags < <(task_flags "$preset")
  mapfile -t addresses < <(slot_addresses "${PS_PORT:-$(job_port)}")
  if ((${#addresses[@]} <= num_ps)); then
    log "error: ${#addresses[@]} task slots for NUM_PS=$num_ps: no worker left"
    return 2
  fi
  ps_hosts=$(IFS=,; echo "${addresses[*]:0:num_ps}")
  worker_hosts=$(IFS=,; echo "${addresses[*]:num_ps}")
  cd "$REPO"
  log "$preset: ps $ps_hosts, workers $worker_hosts"
  # The servers get everything as arguments: pbsdsh passes no environment.
  local task=("$REPO/scripts/ps_task.sh" "$PYTHON" "$REPO" "$ps_hosts"
    "$worker_hosts")
  if [[ $SCHEDULER == slurm ]]; then
    # One task per slot; ps_task.sh takes its index from SLURM_PROCID.
    srun --ntasks="${#addresses[@]}" --distribution=block --kill-on-bad-exit=1 \
      --mpi=none "${task[@]}" &
    SERVERS+=($!)
  else
    for i in "${!addresses[@]}"; do
      pbsdsh -n "$i" -- "${task[@]}" "$i" &
      SERVERS+=($!)
    done
  fi
  wait_for_servers "${addresses[@]}" || code=$?
  if ((code == 0)); then
    "$PYTHON" resnet_main.py --preset="$preset" --ps_hosts="$ps_hosts" \
      --worker_hosts="$worker_hosts" "${flags[@]}" \
      ${EXTRA[@]+"${EXTRA[@]}"} &
    watch_coordinator $! || code=$?
  fi
  # The servers serve until killed; the scheduler also ends any task of the
  # job that is left when this script exits.
  log "stopping the ps and worker servers; they serve until killed, so" \
    "the launcher reports them killed"
  stop_servers
  if ((REQUEUE)); then
    requeue_job
  elif [[ -n $STOPPED ]]; then
    report_stop
  elif ((code)); then
    log "error: the coordinator exited with code $code: $(exit_cause "$code")"
  else
    log "coordinator exited with code 0"
  fi
  return "$code"
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

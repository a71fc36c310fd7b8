#!/bin/bash
# One server of the asynchronous course job (scripts/course_job.sh,
# train_async): task INDEX of the cluster, parameter servers first, then
# workers. srun starts it once per task (INDEX from SLURM_PROCID), aprun
# once per PE (from ALPS_APP_PE), pbsdsh once per node-file slot (INDEX as
# the last argument). It serves until it is killed.
#
#   ps_task.sh PYTHON REPO PS_HOSTS WORKER_HOSTS [INDEX]
set -euo pipefail

python=$1 repo=$2 ps_hosts=$3 worker_hosts=$4
index=${5:-${SLURM_PROCID:-$ALPS_APP_PE}}
IFS=, read -ra ps <<<"$ps_hosts"
if ((index < ${#ps[@]})); then
  job=ps task=$index
else
  job=worker task=$((index - ${#ps[@]}))
fi
cd "$repo"
# A stop to the job (scancel, requeue, preemption) sends SIGTERM to every
# process at once, the servers too; but the coordinator's checkpoint reads
# the variables the parameter servers hold. So under Slurm they ignore it
# and end when the job script stops them (srun kills its tasks) or, at the
# latest, with the job.
if [[ -n ${SLURM_PROCID:-} ]]; then trap '' TERM; fi
exec "$python" resnet_main.py --job_name="$job" --task_index="$task" \
  --ps_hosts="$ps_hosts" --worker_hosts="$worker_hosts"

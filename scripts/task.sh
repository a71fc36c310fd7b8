#!/bin/bash
# A process of a course job (scripts/course_job.sh) on the node its launcher
# (srun, horovodrun, mpirun or aprun) started it on, in the repository REPO:
#
#   task.sh REPO STATUS INDEX COMMAND...
#     a task or rank of a job step: COMMAND, with --task_index=<its rank>
#     where INDEX is set, its exit code then written to STATUS/<its rank>
#     (course_job.sh's run_job_command reads them). The rank is the
#     launcher's: Horovod's, Open MPI's, MPICH's, PMIx's, Cray ALPS's, else
#     the Slurm task's. It traps SIGTERM, which the scheduler sends to every
#     process of the job, so that it outlives the training process's
#     checkpoint and records its code.
#   task.sh REPO --node_gpus PYTHON SCRIPT FLAGS...
#     a one-node task under aprun: PYTHON SCRIPT --num_gpus=<the node's
#     GPUs> FLAGS (so that a --num_gpus of EXTRA_FLAGS wins). ALPS gives a
#     job whole nodes, so every GPU of the node (a /dev/nvidiaN each) is the
#     job's; the batch shell's node, a service node, cannot say how many.
if [[ $2 == --node_gpus ]]; then
  cd "$1" || exit
  gpus=(/dev/nvidia[0-9]*)
  [[ -e ${gpus[0]} ]] || gpus=()
  exec "$3" "$4" --num_gpus="${#gpus[@]}" "${@:5}"
fi
trap : TERM
cd "$1" || exit
status=$2 index=$3
shift 3
rank=${HOROVOD_RANK:-${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-${ALPS_APP_PE:-${SLURM_PROCID:-0}}}}}}
"$@" ${index:+--task_index="$rank"}
code=$?
echo "$code" >"$status/$rank"
exit "$code"

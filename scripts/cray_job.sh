# The Cray variant of the PBS jobs, sourced by scripts/cray/*.pbs: the
# course's cluster (Blue Waters: Cray XE/XK, PBS/Torque with ALPS) runs a
# batch script on a service node, and only aprun starts work on the
# compute nodes. Its job scripts read
#
#   #PBS -l nodes=2:ppn=16:xk
#   source /opt/modules/default/init/bash
#   module load <modules>
#   aprun -n 2 -N 1 python main.py
#
# Here those lines are these variables, which scripts/course_job.sh turns
# into the same commands (the job's log shows each aprun line it runs):
#   MODULES         `module load $MODULES` (default: cray-mpich, the MPI
#                   setup.sh built Horovod with; add the Python module the
#                   virtualenv was made with, e.g. MODULES="bwpy cray-mpich")
#   LAUNCHER=aprun  every task's processes run under aprun: the one-node
#                   tasks `aprun -n 1 -N 1`, the sync task's Horovod ranks
#                   and the async task's ps and workers `aprun -n <nodes x
#                   RANKS_PER_NODE> -N RANKS_PER_NODE`
#   RANKS_PER_NODE  ranks (or ps and worker tasks) per node (default 1:
#                   `-N 1`; ppn=16 counts the node's cores)
#   APRUN_FLAGS     aprun's other options (e.g. "-d 16 -cc none")
# and the rest of course_job.sh's header (DATA_ROOT, LOG_ROOT, EXTRA_FLAGS,
# ...) as under any PBS. A stopped job's resume command names the script
# of scripts/cray/ it ran (JOB_SCRIPTS).
SCHEDULER=pbs
export MODULES=${MODULES-cray-mpich} LAUNCHER=aprun
export RANKS_PER_NODE=${RANKS_PER_NODE:-1} JOB_SCRIPTS=scripts/cray
source "$REPO/scripts/course_job.sh"

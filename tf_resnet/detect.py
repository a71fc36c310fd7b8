"""How this process was started: what launchers and schedulers tell it.

The one place that reads the environment of a launch: horovodrun's and
mpirun's rank variables, `TF_CONFIG`, a Slurm job step. The engine
registry (`engines`) asks it which engine a process was started for; the
engines' cluster resolvers read the same functions.

Imports no TensorFlow.
"""

import json
import os

from tf_resnet.errors import UserInputError

# Variables of the process launchers that make a Horovod rank: horovodrun
# (Gloo) sets HOROVOD_*, Open MPI OMPI_COMM_WORLD_*, MPICH/Intel MPI PMI_*.
RANK_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# The tasks of a parameter-server cluster that only serve.
SERVER_JOBS = ("ps", "worker")


def launcher_world_size():
    """`(processes, variable)` of a horovodrun/mpirun job, else `(1, None)`."""
    for variable in RANK_SIZE_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value), variable
    return 1, None


def read_tf_config():
    """`TF_CONFIG` as a dict (`{}` when unset)."""
    text = os.environ.get("TF_CONFIG", "").strip()
    if not text:
        return {}
    try:
        tf_config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserInputError(f"TF_CONFIG is not valid JSON: {error}") from None
    if not isinstance(tf_config, dict):
        raise UserInputError(f"TF_CONFIG must be a JSON object, got {text!r}")
    return tf_config


def tf_config_has_ps():
    """Whether `TF_CONFIG` names a parameter-server cluster."""
    return "ps" in read_tf_config().get("cluster", {})


def tf_config_workers():
    """Workers (a chief included) of a `TF_CONFIG` cluster without ps.

    0 when `TF_CONFIG` is unset or names parameter servers: what decides
    whether a process is one worker of a multi-worker all-reduce.
    """
    cluster = read_tf_config().get("cluster", {})
    if "ps" in cluster:
        return 0
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def slurm_step_tasks():
    """Tasks of the Slurm job step this process is one of (0: none).

    `srun` sets `SLURM_STEP_NUM_TASKS`; a batch script's own shell is a
    step of one task.
    """
    if "SLURM_PROCID" not in os.environ:
        return 0
    value = os.environ.get("SLURM_STEP_NUM_TASKS", "")
    return int(value) if value.isdigit() else 0


def is_server_task(job_name=None):
    """A ps or worker task of a parameter-server cluster: it only serves.

    Named by `--job_name`, or by a `TF_CONFIG` whose cluster has a `ps`
    job (so one written for multi-worker all-reduce is not taken for it).
    """
    if job_name:
        return job_name in SERVER_JOBS
    tf_config = read_tf_config()
    return (
        "ps" in tf_config.get("cluster", {})
        and tf_config.get("task", {}).get("type") in SERVER_JOBS
    )


def multi_worker_cluster(worker_hosts=()):
    """Why this process is one worker of a multi-worker cluster, or None.

    `--worker_hosts`, a `TF_CONFIG` of several workers and no ps, or a
    Slurm job step of several tasks: the clusters that
    `multi_worker.cluster_resolver` reads, in its order.
    """
    if worker_hosts:
        return "--worker_hosts"
    workers = tf_config_workers()
    if workers > 1:
        return f"TF_CONFIG names {workers} workers, no ps"
    tasks = slurm_step_tasks()
    if tasks > 1:
        return f"a Slurm job step of {tasks} tasks (srun)"
    return None

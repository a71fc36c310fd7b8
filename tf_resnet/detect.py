"""How this process was started: what launchers and schedulers tell it.

The one place that reads the environment of a launch: horovodrun's and
mpirun's rank variables, `TF_CONFIG`, a Slurm job step. The engine
registry (`engines`) asks it which engine a process was started for; the
engines' cluster resolvers read the same functions. Also the interpreter
it runs on, for the commands messages suggest.

Imports no TensorFlow.
"""

import json
import os
import sys

from tf_resnet.errors import UserInputError

# Variables of the process launchers that make a Horovod rank: horovodrun
# (Gloo) sets HOROVOD_*, Open MPI's mpirun OMPI_COMM_WORLD_*, MPICH/Intel
# MPI and `srun --mpi=pmi2` PMI_*.
RANK_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# `srun --mpi=pmix` sets no size: its tasks are MPI ranks by PMIX_RANK, and
# the step's task count is the world's size.
PMIX_RANK = "PMIX_RANK"
# The tasks of a parameter-server cluster that only serve.
SERVER_JOBS = ("ps", "worker")


def interpreter():
    """The Python running now, as a command to copy (`.venv/bin/python`).

    Relative to the working directory when inside it, so a message's
    command reads as the docs' do; a bare `python` may be one without
    TensorFlow.
    """
    relative = os.path.relpath(sys.executable)
    return sys.executable if relative.startswith("..") else relative


def launcher_world_size():
    """`(processes, variable)` of a horovodrun/mpirun job, else `(1, None)`.

    The tasks of a Slurm job step started with an MPI plugin (`srun
    --mpi=pmix` or `pmi2`) count as ranks, so `auto` runs Horovod on them;
    TensorFlow's own workers start with `srun --mpi=none`.
    """
    for variable in RANK_SIZE_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value), variable
    if PMIX_RANK in os.environ and slurm_step_tasks():
        return slurm_step_tasks(), f"{PMIX_RANK}, srun --mpi=pmix"
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
    if not in_slurm_task():
        return 0
    value = os.environ.get("SLURM_STEP_NUM_TASKS", "")
    return int(value) if value.isdigit() else 0


def slurm_job_port():
    """The first port of this Slurm job's servers on each node.

    10000 + 100 * (job id mod 200), as scripts/course_job.sh's `job_port`:
    jobs that share a node listen on ports of their own. One fixed port
    would not fail loudly: TensorFlow's gRPC servers bind with
    SO_REUSEPORT, so a second job's server starts on the same port and the
    two jobs' workers reach each other's servers. Every port, up to the
    100th slot's, stays below 32768, where Linux's default range of ports
    for outgoing connections starts: a server there can find its port
    taken by a connection of any process on the node, even its own job's.
    """
    digits = "".join(
        c for c in os.environ.get("SLURM_JOB_ID", "") if c.isdigit()
    )
    return 10000 + 100 * (int(digits or 0) % 200)


def is_server_task(job_name=None):
    """A ps or worker task of a parameter-server cluster: it only serves."""
    return server_job(job_name) is not None


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


# Who started the processes of this node, and the variables that give each
# its local rank and the node's count: horovodrun, Open MPI, the
# `LOCAL_RANK` convention of torchrun (which this project's launchers
# follow), a Slurm job step.
_LOCAL_VARIABLES = (
    ("horovodrun", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ("mpirun", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("the launcher", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
)


def local_process(task_index=0):
    """`(local_rank, local_size, source)` of this process on its node.

    From the launcher's variables; else Slurm's (`SLURM_LOCALID` and the
    tasks of this node); else, in a PBS job, this task's host counted in
    `$PBS_NODEFILE` (one line per slot; the slot is pbsdsh's
    `PBS_VNODENUM`, else `task_index`); else one process on its node.
    """
    for source, rank, size in _LOCAL_VARIABLES:
        if os.environ.get(rank, "").isdigit():
            return int(os.environ[rank]), _int(size, 1), source
    if os.environ.get("SLURM_LOCALID", "").isdigit():
        return int(os.environ["SLURM_LOCALID"]), _slurm_node_tasks(), "Slurm"
    nodefile = os.environ.get("PBS_NODEFILE", "")
    if nodefile and os.path.isfile(nodefile):
        with open(nodefile, encoding="utf-8") as stream:
            slots = [line.strip() for line in stream if line.strip()]
        slot = _int("PBS_VNODENUM", task_index)
        if 0 <= slot < len(slots):
            host = slots[slot]
            rank = slots[:slot].count(host)
            return rank, slots.count(host), "PBS_NODEFILE"
    return 0, 1, "one process"


def _int(variable, default):
    value = os.environ.get(variable, "")
    return int(value) if value.isdigit() else default


def _slurm_node_tasks():
    """Tasks of this job step on this node (`SLURM_STEP_TASKS_PER_NODE`).

    Reads like `4(x2),2`: 4 tasks on each of the first two nodes, then 2;
    `SLURM_NODEID` picks this node's entry.
    """
    text = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get(
        "SLURM_TASKS_PER_NODE", ""
    )
    counts = []
    for item in filter(None, text.split(",")):
        count, _, times = item.partition("(x")
        counts += [int(count)] * int(times.rstrip(")") or 1)
    node = _int("SLURM_NODEID", 0)
    if node < len(counts):
        return counts[node]
    return _int("SLURM_NTASKS_PER_NODE", 1)


def gpu_ids(count):
    """How CUDA numbers the `count` GPUs TensorFlow sees, in its order.

    `CUDA_VISIBLE_DEVICES` (which Slurm sets from the job's GPUs) renumbers
    them: with `3,5`, TensorFlow's GPU 0 is the node's GPU 3. Without it,
    Slurm's `SLURM_STEP_GPUS`/`SLURM_JOB_GPUS`, else `0..count-1`.
    """
    for variable in (
        "CUDA_VISIBLE_DEVICES",
        "SLURM_STEP_GPUS",
        "SLURM_JOB_GPUS",
    ):
        ids = [i for i in os.environ.get(variable, "").split(",") if i]
        if len(ids) >= count:
            return tuple(ids[:count])
    return tuple(str(i) for i in range(count))


def server_job(job_name=None):
    """`ps` or `worker` for a task that only serves, else None.

    Named by `--job_name`, or by a `TF_CONFIG` whose cluster has a `ps`
    job (so one written for multi-worker all-reduce is not taken for it).
    """
    if job_name:
        return job_name if job_name in SERVER_JOBS else None
    tf_config = read_tf_config()
    job = tf_config.get("task", {}).get("type")
    if "ps" in tf_config.get("cluster", {}) and job in SERVER_JOBS:
        return job
    return None


def cluster_workers(worker_hosts=()):
    """Workers of a multi-worker cluster (0: none).

    `--worker_hosts`, else a `TF_CONFIG` without ps, else the tasks of a
    Slurm job step: the clusters `multi_worker_cluster` recognises.
    """
    if worker_hosts:
        return len(worker_hosts)
    return tf_config_workers() or slurm_step_tasks()


def ps_cluster_workers(worker_hosts=()):
    """Workers of a parameter-server cluster (0: none).

    `--worker_hosts`, else the workers `TF_CONFIG` names.
    """
    if worker_hosts:
        return len(worker_hosts)
    return len(read_tf_config().get("cluster", {}).get("worker", []))


# The variables of a Slurm job step that TensorFlow's SlurmClusterResolver
# reads.
SLURM_STEP_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)


def in_slurm_task():
    """Whether this process is a task of a Slurm job (step)."""
    return "SLURM_PROCID" in os.environ


def slurm_step_slots():
    """Tasks of this job step, once every variable of the step is checked.

    Raises:
      UserInputError: a Slurm task without the variables of a job step
        (a batch script's shell, not `srun`).
    """
    missing = [name for name in SLURM_STEP_VARIABLES if name not in os.environ]
    if missing:
        raise UserInputError(
            f"SLURM_PROCID is set but {', '.join(missing)} is not: run each "
            "worker as a task of one job step (srun)"
        )
    return int(os.environ["SLURM_STEP_NUM_TASKS"])

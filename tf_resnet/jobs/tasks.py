"""A course task's files, run directory and command lines.

A task is a preset run as a batch job. What it reads comes from the
tables of `tf_resnet.config`: its preset's dataset, whose default archive
(`config.datasets`) says where `data/download.py` unpacks it under the
data root, and the weights its preset starts from (`presets.PRETRAINED`,
a file of `families.WEIGHTS`). A plan (`Plan`) is everything the batch
shell needs to run one kind of task: the run directory, the script that
submits it again, the step status folder, and the whole command line,
launcher first.
"""

import dataclasses
import glob
import os

from tf_resnet.config.datasets import DATASETS
from tf_resnet.config.families import WEIGHTS, WEIGHTS_DIR
from tf_resnet.config.presets import PRESETS, PRETRAINED
from tf_resnet.jobs import allocation, status
from tf_resnet.jobs.shell import JobError, job_id, log, value

# The variables that point a task at its data elsewhere.
DATA_VARIABLES = "DATA_ROOT, or TRAIN_DATA and EVAL_DATA"
# The checkout whose scripts/ the tasks run in (course_job.sh puts it first
# on the path, as the checkout of itself).
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
# The shell of every task or rank of a job step (and of aprun's one-node
# tasks), on whichever node its launcher starts it.
TASK_SHELL = ["/bin/bash", os.path.join(SOURCE, "scripts", "task.sh")]


def task_data(preset, env):
    """`(training path, evaluation path, dataset)` of a task.

    Its preset's dataset, as its default archive unpacks under the data
    root; TRAIN_DATA and EVAL_DATA win.
    """
    dataset = PRESETS[preset]["dataset"]
    archive = next(iter(DATASETS[dataset].archives.values()))
    root = env["DATA_ROOT"]
    return (
        value(env, "TRAIN_DATA", archive.split_path(root, training=True)),
        value(env, "EVAL_DATA", archive.split_path(root, training=False)),
        dataset,
    )


def task_weights(preset, env):
    """`(path, name)` of the weights the preset starts from, or None.

    PRETRAINED, by default the file where `data/download.py --weights=NAME`
    puts it in the checkout.
    """
    name = PRETRAINED.get(preset)
    if name is None:
        return None
    default = f"{env['REPO']}/{WEIGHTS_DIR}/{WEIGHTS[name].filename}"
    return value(env, "PRETRAINED", default), name


def run_dir(preset, env):
    """The run directory of a task.

    LOG_ROOT, else $HOME/runs/<task>-<job id>, so that a requeued job,
    whose id is kept, resumes; a --log_root in EXTRA_FLAGS wins, as it
    does on resnet_main.py's command line.
    """
    directory = value(env, "LOG_ROOT") or (
        f"{env.get('HOME', '')}/runs/{preset}-{job_id(env)}"
    )
    for flag in value(env, "EXTRA_FLAGS").split():
        if flag.startswith("--log_root="):
            directory = flag.partition("=")[2]
    return directory


def job_script(preset, env):
    """The script that submits the task again, from the repository.

    In JOB_SCRIPTS (the Cray variant's scripts/cray), else in the
    scheduler's folder.
    """
    scheduler = env["SCHEDULER"]
    extension = "pbs" if scheduler == "pbs" else "sbatch"
    folder = value(env, "JOB_SCRIPTS", f"scripts/{scheduler}")
    return f"{folder}/{preset}.{extension}"


def task_flags(preset, env, directory):
    """resnet_main.py's flags of a task: its data, run directory, weights."""
    train, test, _ = task_data(preset, env)
    flags = [
        f"--train_data_path={train}",
        f"--eval_data_path={test}",
        f"--log_root={directory}",
    ]
    weights = task_weights(preset, env)
    if weights:
        flags.append(f"--pretrained={weights[0]}")
    return flags


def missing_data(path, download_flags, variables, env):
    """The error for a PATH (a file, folder or glob) that matches nothing.

    It names the path, the download that fetches it and the variables that
    point elsewhere; None when the path is there.
    """
    if glob.glob(path):
        return None
    return (
        f"{path}: no such file or folder; download it first: "
        f"{env['PYTHON']} {env['REPO']}/data/download.py {download_flags} "
        f"(or set {variables})"
    )


def task_checks(preset, env):
    """`(first line, errors)`: what the task reads, and what is missing.

    Only the first missing path is worth a line: the job ends on it.
    """
    train, test, dataset = task_data(preset, env)
    root = env["DATA_ROOT"]
    first = f"{preset} reads: train {train}, eval {test} (DATA_ROOT={root})"
    download = f"--dataset={dataset} --output_dir={root}"
    needed = [
        (train, download, DATA_VARIABLES),
        (test, download, DATA_VARIABLES),
    ]
    weights = task_weights(preset, env)
    if weights:
        path, name = weights
        needed.append((path, f"--weights={name}", "PRETRAINED"))
    errors = [missing_data(*need, env) for need in needed]
    return first, [e for e in errors if e]


@dataclasses.dataclass
class Plan:
    """What the batch shell runs for a task, as `plan` prints it.

    Attributes:
      run_dir: the run directory (the stop report's).
      job_script: the script that submits the task again.
      step_status: the folder each task of a job step writes its exit code
        to (`status.step_status_dir`), "" for a command of one process.
      argv: the command line, launcher first.
      servers: the async task's servers' addresses, in task order.
      server_argv: the command line that starts them: srun's or aprun's,
        or `pbsdsh` then the task's command (one pbsdsh -n i each).
    """

    run_dir: str
    job_script: str
    step_status: str
    argv: list
    servers: tuple = ()
    server_argv: tuple = ()

    def lines(self):
        """The plan a value a line: see course_job.sh's `plan_task`."""
        return [
            self.run_dir,
            self.job_script,
            self.step_status,
            ",".join(self.servers),
            str(len(self.server_argv)),
            *self.server_argv,
            *self.argv,
        ]


class Task:
    """A preset's task in this job, checked: its run and its main command.

    Logs what it reads first; raises `JobError` for missing data or
    weights, or LAUNCHER=aprun under Slurm.
    """

    def __init__(self, preset, env, cwd):
        first, errors = task_checks(preset, env)
        log(first)
        if errors:
            raise JobError(errors[0])
        if value(env, "LAUNCHER") == "aprun" and env["SCHEDULER"] != "pbs":
            raise JobError(allocation.APRUN_UNDER_SLURM)
        self.preset, self.env, self.cwd = preset, env, cwd
        self.run_dir = run_dir(preset, env)
        self.job_script = job_script(preset, env)
        self.main = [
            env["PYTHON"], "resnet_main.py", f"--preset={preset}",
            *task_flags(preset, env, self.run_dir),
        ]  # fmt: skip
        self.extra = value(env, "EXTRA_FLAGS").split()

    def plan(self, argv, step_status="", **servers):
        return Plan(self.run_dir, self.job_script, step_status, argv, **servers)

    def step(self, index, command):
        """`(step status folder, the command each task runs)` in a step.

        Each task runs `command` in TASK_SHELL, with --task_index=<its
        rank> where `index` is "1", and writes its exit code to the
        folder.
        """
        folder = status.step_status_dir(self.env, self.cwd)
        return folder, [*TASK_SHELL, self.env["REPO"], folder, index, *command]


def plan_single(task):
    """One resnet_main.py process on the node's GPUs.

    --num_gpus: one process uses only the GPUs it is asked to; under
    LAUNCHER=aprun on a compute node, `aprun -n 1 -N 1`, where TASK_SHELL
    counts its GPUs (the batch shell's node, a service node, cannot).
    """
    launch = allocation.aprun_launch(task.env, "1")
    if launch:
        log(f"{task.preset} on the compute nodes: {' '.join(launch)}")
        node = [*TASK_SHELL, task.env["REPO"], "--node_gpus"]
        return task.plan([*launch, *node, *task.main, *task.extra])
    host = os.uname().nodename
    log(f"{task.preset} on {host}")
    gpus = allocation.gpus_on_node(task.env, host)
    return task.plan([*task.main, f"--num_gpus={gpus}", *task.extra])


def plan_horovod(task):
    """One Horovod rank per task slot, started by LAUNCHER.

    horovodrun (ssh and Gloo), srun (Slurm's PMIx or PMI2 and Horovod's
    MPI), mpirun (the MPI's own launcher) or aprun (Cray ALPS, as the
    course's `aprun -n N -N 1`): `allocation.horovod_launcher`. Each rank
    runs in TASK_SHELL, which keeps its own exit code where the launcher
    would exit 1 for any failed rank.
    """
    slots = allocation.job_slots(task.env)
    launch, line, error = allocation.horovod_launcher(
        task.env, task.preset, slots
    )
    log(line)
    if error:
        raise JobError(error)
    if launch[0] == "aprun":
        log(f"ranks on the compute nodes: {' '.join(launch)}")
    folder, rank = task.step("", [*task.main, *task.extra])
    return task.plan([*launch, *rank], folder)


def plan_workers(task):
    """One multi_worker worker per task slot, slot 0 the chief.

    TensorFlow's MultiWorkerMirroredStrategy: no Horovod, no ssh. Slot i
    listens on MW_PORT + i. Started by srun (a job step that ends when one
    fails), by aprun (LAUNCHER=aprun: a PE per slot of `placed_slots`,
    its index from ALPS_APP_PE) or by course_job.sh's `pbs_workers`
    (pbsdsh -n i each). Everything is on the command line (pbsdsh passes
    no environment), the engine's flags last so that they win over
    EXTRA_FLAGS.
    """
    found = allocation.addresses(task.env, "MW_PORT")
    hosts = ",".join(found)
    log(f"{task.preset}: {len(found)} multi_worker workers at {hosts}")
    command = [
        *task.main, *task.extra, "--distribution=multi_worker",
        f"--worker_hosts={hosts}",
    ]  # fmt: skip
    if task.env["SCHEDULER"] == "slurm":
        folder, worker = task.step("1", command)
        launch = allocation.srun_step(len(found), "none")
        return task.plan([*launch, *worker], folder)
    launch = allocation.aprun_launch(task.env)
    if launch:
        log(f"workers on the compute nodes: {' '.join(launch)}")
        folder, worker = task.step("1", command)
        return task.plan([*launch, *worker], folder)
    return task.plan(["pbs_workers", str(len(found)), *command])


def plan_async(task):
    """Parameter servers on slots 0..NUM_PS-1, workers on the others.

    Each a `scripts/ps_task.sh` (everything as arguments: pbsdsh passes no
    environment), started by srun (its index from SLURM_PROCID), one aprun
    (LAUNCHER=aprun: a PE per task, from ALPS_APP_PE) or pbsdsh per slot.
    The coordinator runs in the batch shell on the first node.
    """
    env = task.env
    found = allocation.addresses(env, "PS_PORT")
    ps_hosts, worker_hosts = allocation.parameter_servers(
        found, value(env, "NUM_PS", "1")
    )
    log(f"{task.preset}: ps {ps_hosts}, workers {worker_hosts}")
    server = [
        f"{env['REPO']}/scripts/ps_task.sh", env["PYTHON"], env["REPO"],
        ps_hosts, worker_hosts,
    ]  # fmt: skip
    if env["SCHEDULER"] == "slurm":
        launch = allocation.srun_step(
            len(found), "none", "--kill-on-bad-exit=1"
        )
    else:
        launch = allocation.aprun_launch(env) or ["pbsdsh"]
        if launch[0] == "aprun":
            log(
                "ps and worker servers on the compute nodes: "
                f"{' '.join(launch)}"
            )
    coordinator = [
        *task.main[:3], f"--ps_hosts={ps_hosts}",
        f"--worker_hosts={worker_hosts}", *task.main[3:], *task.extra,
    ]  # fmt: skip
    return task.plan(
        coordinator, servers=tuple(found), server_argv=(*launch, *server)
    )


# What course_job.sh's `plan_task` asks for, by the kind of task.
PLANS = {
    "single": plan_single,
    "ranks": plan_horovod,
    "workers": plan_workers,
    "async": plan_async,
}

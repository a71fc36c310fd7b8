"""The decisions and messages of the course's batch jobs.

`scripts/course_job.sh`, sourced by the Slurm and PBS job scripts, keeps in
bash only what must run in the batch shell itself: starting and watching
the training processes, the signal traps, requeues, `module load`. What it
decides and what it says is here, where it can be read and tested without
a scheduler: which hosts and task slots the allocation holds, the ports,
the data and run directory of a task, which task's exit code a failed job
step ends with, and the lines that say where a stopped run resumes.

The shell calls it as

  python -m tf_resnet.launch.batch_job <subcommand> [args]

with the shell's variables in the environment (course_job.sh's `batch_job`
passes SCHEDULER, REPO, PYTHON, DATA_ROOT, RUN_DIR and JOB_SCRIPT, which
the batch shell does not export). Every line it logs has the job's prefix
`HH:MM:SS course_job: ` and goes to stderr, as the shell's own `log`; what
the shell reads back goes to stdout, a value a line (paths may hold spaces,
not newlines). A check that fails exits 2, as resnet_main.py does on bad
input. The variables are documented in course_job.sh's header, where a
user reading a job script looks for them.

It imports the standard library only (no TensorFlow: a job makes several
of these calls, one each second while a job step runs) and starts in tens
of milliseconds.
"""

import collections
import glob
import itertools
import os
import re
import shutil
import subprocess
import sys
import time

from tf_resnet.peer_watch import LOST_PEER

# What resnet_main.py's exit codes mean (its docstring).
EXIT_CAUSES = {
    2: "bad flags or data (its error: line above names them)",
    3: "the training diverged (its error: line above names the step)",
    LOST_PEER: "it lost a peer: a node or a process of the job is gone, cut "
    "off or silent for --peer_timeout_secs",
}
BAD_INPUT = 2
# The variables that point a task at its data elsewhere.
DATA_VARIABLES = "DATA_ROOT, or TRAIN_DATA and EVAL_DATA"
APRUN_UNDER_SLURM = (
    "LAUNCHER=aprun is Cray ALPS under PBS; under Slurm use srun"
)


class JobError(Exception):
    """A check failed: its message is logged as an error, the job exits 2."""


def log(message):
    """Writes one line of the job's log, as course_job.sh's `log` does."""
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    sys.stderr.write(f"{stamp} course_job: {message}\n")
    sys.stderr.flush()


def value(env, name, default=""):
    """`${NAME:-default}`: an empty variable counts as unset, as in bash."""
    return env.get(name) or default


def job_id(env):
    """The scheduler's job id, without PBS's server name (`42.server`).

    A requeued Slurm job keeps its id, so the default run directory and
    the step status folder of its next run are the same.
    """
    if env["SCHEDULER"] == "slurm":
        return env["SLURM_JOB_ID"]
    return env["PBS_JOBID"].split(".", 1)[0]


def job_port(env):
    """The first port of this job's servers: 10000 + 100 * (id mod 200).

    Jobs sharing a node thus listen on ports of their own (up to 100 task
    slots each). A fixed port is not enough: TensorFlow's gRPC servers bind
    with SO_REUSEPORT, so a second job's server on the same port starts
    without an error and the two jobs' processes reach each other's
    servers. The ports stay below 32768, where Linux's default range for
    outgoing connections starts: a server there can find its port taken by
    any connection.
    """
    digits = "".join(c for c in job_id(env) if c.isdigit())
    return 10000 + 100 * (int(digits) % 200)


def tasks_per_node(text):
    """Slurm's SLURM_TASKS_PER_NODE, one count per node.

    It reads like "4(x2),2": 4 tasks on each of the first two nodes, then 2.
    """
    counts = []
    for item in text.split(","):
        count, _, times = item.partition("(x")
        counts += [int(count)] * int(times.rstrip(")") or 1)
    return counts


def slurm_slots(hostnames, counts):
    """One host per task slot, in task order, from Slurm's node list."""
    return [
        host
        for host, n in zip(hostnames, counts, strict=False)
        for _ in range(n)
    ]


def job_slots(env, hostnames=None):
    """The host of each task slot of the allocation, in task order.

    PBS's $PBS_NODEFILE lists each host once per slot (ppn); Slurm's
    SLURM_JOB_NODELIST is expanded by `scontrol show hostnames` (it may be
    a range like node[01-04]) unless `hostnames` is given.
    """
    if env["SCHEDULER"] == "pbs":
        with open(env["PBS_NODEFILE"]) as stream:
            return stream.read().splitlines()
    if hostnames is None:
        hostnames = subprocess.run(
            ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]],
            check=True, capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
    return slurm_slots(hostnames, tasks_per_node(env["SLURM_TASKS_PER_NODE"]))


def horovod_hosts(slots):
    """The -H of horovodrun: "host1:4,host2:4", each host with its slots."""
    counts = collections.Counter(slots)
    return ",".join(f"{host}:{n}" for host, n in counts.items())


def aprun_slots(slots, ranks_per_node=""):
    """`(hosts, per_node, depth)` of the PEs `aprun -N per_node` starts.

    ALPS places PEs node by node, `per_node` on each node of the job
    (RANKS_PER_NODE, default: the first node's task slots), so the
    course's `aprun -n 2 -N 1` on `nodes=2:ppn=16` is RANKS_PER_NODE=1:
    its two PEs are the first slot of each node. `depth` is the node's
    slots each PE gets (aprun's -d): ALPS binds a PE to that many CPUs, by
    default one, where TensorFlow's threads would share one core (a
    parameter-server worker so bound all but stalls).
    """
    nodes = [(host, len(list(run))) for host, run in itertools.groupby(slots)]
    per_node = int(ranks_per_node) if ranks_per_node else nodes[0][1]
    hosts = [host for host, _ in nodes for _ in range(per_node)]
    return hosts, per_node, max(1, nodes[0][1] // per_node)


def placed_slots(env):
    """The host of each task, in task order, as the launcher places them.

    A task slot each, or under LAUNCHER=aprun ALPS's PEs (`aprun_slots`).
    """
    slots = job_slots(env)
    if value(env, "LAUNCHER") == "aprun":
        return aprun_slots(slots, value(env, "RANKS_PER_NODE"))[0]
    return slots


def horovod_plan(slots, launcher, ranks_per_node=""):
    """`(ranks, hosts, per_node)` of a Horovod job step.

    One rank per task slot; under aprun (Cray ALPS), `aprun -n ranks -N
    per_node` places RANKS_PER_NODE ranks on each node (`aprun_slots`).
    `per_node` is "" for the other launchers.
    """
    if launcher != "aprun":
        return len(slots), horovod_hosts(slots), ""
    hosts, per_node, _ = aprun_slots(slots, ranks_per_node)
    return len(hosts), horovod_hosts(hosts), str(per_node)


def aprun_argv(env, pes, per_node, depth):
    """`aprun -n PES -N PER_NODE -d DEPTH $APRUN_FLAGS`, before a command.

    What starts a task's processes on the compute nodes of a Cray, whose
    batch shell runs on a service node that only aprun leaves. `-d` is
    `aprun_slots`' depth unless APRUN_FLAGS gives one.
    """
    flags = value(env, "APRUN_FLAGS").split()
    argv = ["aprun", "-n", str(pes), "-N", str(per_node)]
    if "-d" not in flags:
        argv += ["-d", str(depth)]
    return argv + flags


def horovod_launcher(env, preset, slots):
    """The launcher command line of a Horovod job step, and its first line.

    One rank per task slot, started by LAUNCHER (default horovodrun):
    horovodrun (ranks of other nodes over ssh, Gloo; HOROVOD_FLAGS),
    srun (Slurm's MPI plugin SRUN_MPI, default pmix: no ssh), mpirun (the
    MPI's own launcher, which reads the allocation; under PBS without TM
    support it needs the node file) or aprun (Cray ALPS under PBS, where
    the batch shell runs on a service node; APRUN_FLAGS). horovodrun and
    mpirun would end their ranks on SIGTERM, so they run `ignoring_term`
    (course_job.sh): the ranks checkpoint on it. For srun the result is
    `["srun", mpi plugin, ranks]`, which course_job.sh's `step_command`
    makes a job step of.

    Returns:
      `(argv, line, error)`: the launcher's arguments before the rank's
      command (None with an error), the job's line that says how many
      ranks run where, and why the launcher cannot run here (the launcher
      is unknown, or not one of this scheduler's), else None.
    """
    launcher = value(env, "LAUNCHER", "horovodrun")
    ranks, hosts, per_node = horovod_plan(
        slots, launcher, value(env, "RANKS_PER_NODE")
    )
    line = f"{preset}: {ranks} ranks on {hosts} ({launcher})"
    scheduler = env["SCHEDULER"]
    if launcher == "horovodrun":
        python_bin = os.path.dirname(env["PYTHON"]) or "."
        argv = ["ignoring_term", f"{python_bin}/horovodrun", "-np", str(ranks)]
        argv += ["-H", hosts, "--gloo", *value(env, "HOROVOD_FLAGS").split()]
    elif launcher == "srun":
        argv = ["srun", value(env, "SRUN_MPI", "pmix"), str(ranks)]
        if scheduler != "slurm":
            error = "LAUNCHER=srun needs Slurm; use mpirun or horovodrun"
            return None, line, error
    elif launcher == "mpirun":
        argv = ["ignoring_term", "mpirun", "-np", str(ranks)]
        if scheduler == "pbs":
            argv += ["-hostfile", env["PBS_NODEFILE"]]
    elif launcher == "aprun":
        if scheduler != "pbs":
            return None, line, APRUN_UNDER_SLURM
        depth = aprun_slots(slots, value(env, "RANKS_PER_NODE"))[2]
        argv = aprun_argv(env, ranks, per_node, depth)
    else:
        error = (
            f"LAUNCHER={launcher}: expected horovodrun, srun, mpirun or aprun"
        )
        return None, line, error
    return argv, line, None


def slot_addresses(slots, port):
    """host:port of each task slot, in slot order: slot i on port + i."""
    return [f"{host}:{port + i}" for i, host in enumerate(slots)]


def addresses(env, port_variable):
    """The tasks' addresses, from `port_variable` or the job's port.

    A task each of `placed_slots`, in task order.
    """
    port = value(env, port_variable)
    port = int(port) if port else job_port(env)
    return slot_addresses(placed_slots(env), port)


def parameter_servers(addresses_, num_ps):
    """`(ps_hosts, worker_hosts)`: slots 0..num_ps-1 serve, the rest work.

    Raises:
      JobError: no slot is left for a worker.
    """
    if len(addresses_) <= int(num_ps):
        raise JobError(
            f"{len(addresses_)} task slots for NUM_PS={num_ps}: no worker left"
        )
    n = int(num_ps)
    return ",".join(addresses_[:n]), ",".join(addresses_[n:])


def task_data(preset, env):
    """A task's training path, evaluation path and download.py's flag."""
    root = env["DATA_ROOT"]
    if preset == "course_tinyimagenet":
        train = test = f"{root}/tiny-imagenet-200"
        dataset = "tinyimagenet"
    else:
        train = f"{root}/cifar-100-binary/train.bin"
        test = f"{root}/cifar-100-binary/test.bin"
        dataset = "cifar100"
    return (
        value(env, "TRAIN_DATA", train),
        value(env, "EVAL_DATA", test),
        f"--dataset={dataset}",
    )


def task_weights(env):
    """The weights resnet18_cifar100 starts from."""
    return value(
        env, "PRETRAINED", f"{env['REPO']}/weights/resnet18-f37072fd.pth"
    )


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
    if preset == "resnet18_cifar100":
        flags.append(f"--pretrained={task_weights(env)}")
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
    first = (
        f"{preset} reads: train {train}, eval {test} "
        f"(DATA_ROOT={env['DATA_ROOT']})"
    )
    download = f"{dataset} --output_dir={env['DATA_ROOT']}"
    needed = [
        (train, download, DATA_VARIABLES),
        (test, download, DATA_VARIABLES),
    ]
    if preset == "resnet18_cifar100":
        needed.append((task_weights(env), "--weights=resnet18", "PRETRAINED"))
    errors = [missing_data(*need, env) for need in needed]
    return first, [e for e in errors if e]


def gpus_on_node(env, hostname):
    """The GPUs the scheduler gave this node.

    Slurm's count, else the devices CUDA_VISIBLE_DEVICES lists, else
    Torque's $PBS_GPUFILE (one line per GPU of the job, as host-gpuN),
    else none. resnet_main.py uses only the GPUs --num_gpus asks for.
    """
    if value(env, "SLURM_GPUS_ON_NODE"):
        return env["SLURM_GPUS_ON_NODE"]
    if value(env, "CUDA_VISIBLE_DEVICES"):
        return str(len(env["CUDA_VISIBLE_DEVICES"].split(",")))
    path = value(env, "PBS_GPUFILE")
    if path and os.path.isfile(path):
        with open(path) as stream:
            lines = stream.read().splitlines()
        return str(sum(x.startswith(f"{hostname}-gpu") for x in lines))
    return "0"


def step_status_dir(env, cwd):
    """A fresh folder for the exit codes of this run of the job.

    On the shared file system (the tasks run on other nodes), beside the
    job's output; a requeued job's run has its own (SLURM_RESTART_COUNT),
    and so has each batch shell (JOB_SHELL, its pid): jobs that share a
    job id, as stand-in jobs do, must not empty each other's.
    """
    base = value(env, "SLURM_SUBMIT_DIR", cwd)
    restart = value(env, "SLURM_RESTART_COUNT", "0")
    shell = value(env, "JOB_SHELL", "0")
    directory = f"{base}/.tf-resnet-steps/{job_id(env)}.{restart}.{shell}"
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, exist_ok=True)
    return directory


def failed_task(codes):
    """`(task, code)` whose code the failed step ends with, or None.

    `codes` is `{task: code}` as the tasks wrote them (see TASK_SHELL in
    course_job.sh), in the folder's order. The first task that failed of
    itself wins over one that lost its peers (4): when one task fails, the
    others of the step exit 4, and only the first says why.
    """
    lost = None
    for task, code in codes.items():
        if code == str(LOST_PEER):
            lost = lost or (task, code)
        elif code and code != "0":
            return task, code
    return lost


def read_codes(directory):
    """`{task: code}` of the step status folder, in the shell's glob order.

    A folder that is gone holds none, as the shell's glob found none in
    it: a polling job must not fail on it.
    """
    codes = {}
    names = os.listdir(directory) if os.path.isdir(directory) else []
    for name in sorted(names):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path) as stream:
                codes[name] = stream.read().rstrip("\n")
    return codes


def exit_cause(code):
    """What resnet_main.py's exit code says went wrong."""
    return EXIT_CAUSES.get(int(code), "see its output above")


def newest_checkpoint(directory, index_text=None):
    """The run's newest checkpoint, as "step N (DIR/ckpt-N)".

    From TensorFlow's `checkpoint` index in the run directory (its
    model_checkpoint_path line); "none in DIR, so it starts over" before
    the first.
    """
    if index_text is None:
        try:
            with open(f"{directory}/checkpoint") as stream:
                index_text = stream.read()
        except OSError:
            index_text = ""
    found = re.search(r'^model_checkpoint_path: "(.*)"$', index_text, re.M)
    if found and found[1]:
        name = found[1].rpartition("/")[2]
        return f"step {name.rpartition('-')[2]} ({directory}/{name})"
    return f"none in {directory or 'the run directory'}, so it starts over"


def resume_command(scheduler, directory, script):
    """The command that submits the stopped run again, where it stopped."""
    if scheduler == "pbs":
        return f"qsub -v LOG_ROOT={directory} {script}"
    return f"LOG_ROOT={directory} sbatch {script}"


def stop_report(env, stopped):
    """The job's last two lines after a stop signal (or PBS's time limit).

    Where the run stopped and how it goes on. The training processes say
    so too, but a launcher may drop their last lines (horovodrun ends the
    ssh sessions of other nodes' ranks on SIGTERM), so the job says it
    from what is on disk.
    """
    directory = env.get("RUN_DIR", "")
    how = resume_command(env["SCHEDULER"], directory, env.get("JOB_SCRIPT", ""))
    by = f" by SIG{stopped}" if stopped else ""
    return [
        f"stopped{by}; the newest checkpoint: {newest_checkpoint(directory)}",
        "to resume there, submit it again from the repository with the same "
        f"LOG_ROOT: {how} (a job the scheduler requeues resumes by itself)",
    ]


def requeue_after_lost_task(env):
    """`(requeue?, line)` for a step that lost a task (exit 4).

    A lost node or process is what a requeue fixes, from the last
    checkpoint, up to MAX_REQUEUES times (default 2) per job; only Slurm
    requeues (`line` is None under PBS).
    """
    if env["SCHEDULER"] != "slurm":
        return False, None
    restarts = int(value(env, "SLURM_RESTART_COUNT", "0"))
    most = value(env, "MAX_REQUEUES", "2")
    if restarts >= int(most):
        return False, (
            f"a task lost its peers again; restarted {restarts} times already "
            f"(MAX_REQUEUES={most}): not requeueing"
        )
    return True, (
        f"a task lost its peers (exit 4): requeueing, restart {restarts + 1} "
        f"of at most {most}"
    )


# The subcommands: each takes the environment and its arguments, and
# returns the lines to print on stdout (or an exit code, for a yes or no).


def _task(env, preset):
    """Logs what the task reads and checks it; prints its run and flags."""
    first, errors = task_checks(preset, env)
    log(first)
    if errors:
        raise JobError(errors[0])
    if value(env, "LAUNCHER") == "aprun" and env["SCHEDULER"] != "pbs":
        raise JobError(APRUN_UNDER_SLURM)
    directory = run_dir(preset, env)
    script = job_script(preset, env)
    return [directory, script, *task_flags(preset, env, directory)]


def _need_data(env, path, download_flags, variables):
    error = missing_data(path, download_flags, variables, env)
    if error:
        raise JobError(error)
    return []


def _horovod(env):
    plan = horovod_plan(
        job_slots(env), value(env, "LAUNCHER"), value(env, "RANKS_PER_NODE")
    )
    return [str(x) for x in plan]


def _launcher(env, preset):
    """Logs how many ranks run where; prints the launcher's arguments."""
    argv, line, error = horovod_launcher(env, preset, job_slots(env))
    log(line)
    if error:
        raise JobError(error)
    return argv


def _aprun(env, pes=""):
    """The aprun arguments before a task's command, a line each.

    None but under LAUNCHER=aprun. `pes` 1: one process on one node (the
    one-node tasks); else a PE per task (`placed_slots`), as the servers
    and workers take their addresses.
    """
    if value(env, "LAUNCHER") != "aprun":
        return []
    if env["SCHEDULER"] != "pbs":
        raise JobError(APRUN_UNDER_SLURM)
    slots = job_slots(env)
    if pes == "1":  # The whole node.
        return aprun_argv(env, 1, 1, aprun_slots(slots, "1")[2])
    hosts, per_node, depth = aprun_slots(slots, value(env, "RANKS_PER_NODE"))
    return aprun_argv(env, len(hosts), per_node, depth)


def _workers(env):
    found = addresses(env, "MW_PORT")
    return [str(len(found)), ",".join(found)]


def _servers(env):
    found = addresses(env, "PS_PORT")
    return [
        str(len(found)),
        *parameter_servers(found, value(env, "NUM_PS", "1")),
    ]


def _failed_task(env, directory):
    failed = failed_task(read_codes(directory))
    return [" ".join(failed)] if failed else []


def _stop_report(env, stopped=""):
    for line in stop_report(env, stopped):
        log(line)
    return []


def _requeue_line(env):
    log(
        f"requeueing job {env['SLURM_JOB_ID']}; it resumes from "
        f"{newest_checkpoint(env.get('RUN_DIR', ''))}"
    )
    return []


def _lost_task(env):
    requeue, line = requeue_after_lost_task(env)
    if line:
        log(line)
    return 0 if requeue else 1


SUBCOMMANDS = {
    "task": _task,  # PRESET: run dir, job script, flags
    "need_data": _need_data,  # PATH DOWNLOAD_FLAGS VARIABLES
    "slots": lambda env: job_slots(env),
    "horovod_hosts": lambda env: [horovod_hosts(job_slots(env))],
    "horovod": _horovod,  # ranks, -H hosts, aprun's per node
    "launcher": _launcher,  # PRESET: a Horovod step's launcher arguments
    "aprun": _aprun,  # [1]: aprun's arguments (LAUNCHER=aprun), else none
    "workers": _workers,  # count, multi_worker's --worker_hosts
    "servers": _servers,  # count, --ps_hosts, --worker_hosts
    "port": lambda env: [str(job_port(env))],
    "gpus": lambda env: [gpus_on_node(env, os.uname().nodename)],
    "step_dir": lambda env: [
        step_status_dir(env, env.get("PWD") or os.getcwd())
    ],
    "failed_task": _failed_task,  # STEP_STATUS
    "exit_cause": lambda env, code: [exit_cause(code)],
    "stop_report": _stop_report,  # SIGNAL NAME or ""
    "requeue_line": _requeue_line,
    "lost_task": _lost_task,  # exit 0: requeue
}


def main(argv=None, env=None):
    """Runs one subcommand; returns its exit code (2 for a failed check)."""
    argv = sys.argv[1:] if argv is None else argv
    env = os.environ if env is None else env
    try:
        result = SUBCOMMANDS[argv[0]](env, *argv[1:])
    except JobError as error:
        log(f"error: {error}")
        return BAD_INPUT
    if isinstance(result, int):
        return result
    for line in result:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

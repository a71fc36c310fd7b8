"""The allocation of a batch job: its task slots, ports and launchers.

Which hosts and task slots the scheduler gave the job (Slurm's node list
and tasks per node, PBS's node file), where Cray's ALPS places its PEs,
the ports of the job's servers, and the command line of each launcher
that starts a task's processes on other nodes (horovodrun, srun, mpirun,
aprun).
"""

import collections
import itertools
import os
import socket
import subprocess
import time

from tf_resnet.jobs.shell import JobError, job_id, proc_stat, value

APRUN_UNDER_SLURM = (
    "LAUNCHER=aprun is Cray ALPS under PBS; under Slurm use srun"
)


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


def srun_step(tasks, mpi, *options):
    """The srun command line of a job step of `tasks` tasks, before a command.

    One task per slot, with Slurm's MPI plugin `mpi` (none for TensorFlow's
    own workers and servers, even where the cluster's MpiDefault is an
    MPI). The job steps of training tasks take no --kill-on-bad-exit
    (`options`): srun would have Slurm signal the step on every node, and
    where a node is lost that signal waits in Slurm's queue until the node
    is back, then stops the requeued job's step of the same number;
    course_job.sh's `run_job_command` ends the step itself.
    """
    return [
        "srun", f"--ntasks={tasks}", "--distribution=block", *options,
        f"--mpi={mpi}",
    ]  # fmt: skip


def aprun_launch(env, pes=""):
    """The aprun arguments before a task's command; none but under aprun.

    `pes` "1": one process on one node (the one-node tasks); else a PE per
    task (`placed_slots`), as the servers and workers take their
    addresses.

    Raises:
      JobError: LAUNCHER=aprun under Slurm.
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


def horovod_launcher(env, preset, slots):
    """The launcher command line of a Horovod job step, and its first line.

    One rank per task slot, started by LAUNCHER (default horovodrun):
    horovodrun (ranks of other nodes over ssh, Gloo; HOROVOD_FLAGS),
    srun (Slurm's MPI plugin SRUN_MPI, default pmix: no ssh), mpirun (the
    MPI's own launcher, which reads the allocation; under PBS without TM
    support it needs the node file) or aprun (Cray ALPS under PBS, where
    the batch shell runs on a service node; APRUN_FLAGS). horovodrun and
    mpirun would end their ranks on SIGTERM, so they run `ignoring_term`
    (course_job.sh): the ranks checkpoint on it. srun's is a job step of
    one task per rank (`srun_step`).

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
        argv = srun_step(ranks, value(env, "SRUN_MPI", "pmix"))
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


def running(pid):
    """Whether process `pid` runs (a zombie has ended)."""
    try:
        return proc_stat(pid)[0] != "Z"
    except OSError:
        return False


def wait_for_servers(servers, pids, timeout):
    """Returns once every host:port of `servers` accepts connections.

    The coordinator would fail on a server that is not up yet.

    Raises:
      JobError: after `timeout` seconds, or as soon as one of `pids` (the
        processes that started the servers) has exited.
    """
    deadline = time.monotonic() + timeout
    for address in servers:
        host, _, port = address.rpartition(":")
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
                break
            except OSError:
                pass
            if not all(running(pid) for pid in pids):
                raise JobError(
                    "a server task exited before serving (see above)"
                )
            if time.monotonic() > deadline:
                raise JobError(f"no server at {address} after {timeout:g}s")
            time.sleep(1)


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

"""Runs parameter-server training on one machine: ps, workers, coordinator.

  python -m tf_resnet.launch.ps --num_ps=1 --num_workers=2 -- \
      --dataset=cifar10 --train_data_path='cifar-10-batches-bin/data_batch*' \
      --eval_data_path=cifar-10-batches-bin/test_batch.bin \
      --log_root=/tmp/ps_run

Everything after `--` is passed to every `resnet_main.py` process; the
launcher adds the cluster flags (`--ps_hosts --worker_hosts --job_name
--task_index`, ports picked free on 127.0.0.1) and
`--distribution=parameter_server` for the coordinator (another engine in
the flags is refused, not overridden). Each task is a separate process, as
TensorFlow needs (in-process clusters hang).

Network isolation: TensorFlow's gRPC server listens on every interface
(`0.0.0.0` is hard-coded in `grpc_server_lib.cc`) and runs whatever graph a
peer sends it. So by default the launcher first moves itself into a new
network namespace whose only device is the loopback, and the cluster lives
there: nothing it opens is reachable from outside. This needs root or
unprivileged user namespaces (Linux); `--network=host` skips it, leaving the
ports open on all interfaces while training runs.

Teardown: the tasks are one `processes.ProcessGroup`, so Ctrl-C in the
terminal reaches only the launcher, which stops them in order: first the
coordinator (SIGTERM: it writes a final checkpoint, which needs the ps
alive), then the servers, which TensorFlow cannot stop otherwise. Each task
also gets SIGKILL if the launcher itself is killed, so none outlives it.
The tasks are not peers, so `processes.run_peers` (the first exit ends the
job) does not fit: `supervise` below waits for the coordinator alone.

Failures (up to `--max_restarts` in all, then everything is stopped and the
launcher exits 1):
  * a worker dies: it is restarted at the same address. TensorFlow's
    coordinator re-runs the steps that were on it elsewhere, waits for it to
    serve again and re-creates its input pipeline on it (its shard's
    stream starts again where this run's started, so some examples come
    round sooner), so training goes on without a restart of the
    coordinator.
  * a ps dies: its variables are gone, which the coordinator cannot repair.
    It stops with exit code 4 naming the latest checkpoint (it is given
    `--ps_failure_secs` to notice and then killed), the whole cluster is
    stopped and started again, and the new coordinator resumes from that
    checkpoint: the steps since it are trained again.
"""

import os
import socket
import subprocess
import sys
import time

from tf_resnet.engines import registry
from tf_resnet.launch import cli, private_network, processes

LISTENERS = "TensorFlow's servers"
# The engines this cluster runs.
CLUSTER_ENGINES = registry.launched_by("ps")
log = cli.logger("launch.ps")


class LaunchError(Exception):
    """The cluster could not be started or lost a task."""


def parse_args(argv):
    """The launcher's own flags; those after `--` go to `resnet_main.py`."""
    parser = cli.Parser(
        log,
        prog="python -m tf_resnet.launch.ps",
        description="Starts ps and worker tasks and the coordinator of "
        "--distribution=parameter_server on this machine. Flags after -- go "
        "to resnet_main.py.",
    )
    parser.add_argument(
        "--num_ps", type=int, default=1, help="Parameter-server tasks."
    )
    parser.add_argument(
        "--num_workers", type=int, default=2, help="Worker tasks."
    )
    private_network.add_network_flag(parser, LISTENERS)
    parser.add_argument(
        "--start_timeout_secs",
        type=float,
        default=300,
        help="How long the ps and workers may take to start serving.",
    )
    parser.add_argument(
        "--max_restarts",
        type=int,
        default=3,
        help="How many dead tasks are restarted in all: a worker alone, a ps "
        "together with the whole cluster, which resumes from the last "
        "checkpoint. 0: the first dead task stops the cluster.",
    )
    parser.add_argument(
        "--ps_failure_secs",
        type=float,
        default=60,
        help="How long the coordinator may take to notice a dead ps and exit "
        "before it is killed.",
    )
    parser.add_argument(
        "--stop_timeout_secs",
        type=float,
        default=120,
        help="How long the coordinator may take to checkpoint after a stop "
        "signal before it is killed.",
    )
    args = parser.parse_launcher_args(argv)
    if args.num_ps < 1 or args.num_workers < 1:
        parser.error("--num_ps and --num_workers must be at least 1")
    if args.max_restarts < 0:
        parser.error("--max_restarts must be at least 0")
    parser.check_engine(args, CLUSTER_ENGINES, "this cluster runs")
    return args


class Cluster:
    """The tasks of one run; `stop` ends every one of them."""

    def __init__(self, main, main_flags, num_ps, num_workers):
        ports = processes.free_ports(num_ps + num_workers)
        self.addresses = {
            "ps": [f"127.0.0.1:{port}" for port in ports[:num_ps]],
            "worker": [f"127.0.0.1:{port}" for port in ports[num_ps:]],
        }
        self.command = [
            sys.executable,
            main,
            *main_flags,
            f"--ps_hosts={','.join(self.addresses['ps'])}",
            f"--worker_hosts={','.join(self.addresses['worker'])}",
        ]
        # Flags name the cluster; a TF_CONFIG from the caller would not.
        self.env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        self.tasks = processes.ProcessGroup(log)
        self.servers = {}  # (job, index) -> Popen
        self.coordinator = None

    def start_server(self, job, index):
        """Starts (or restarts) task `index` of `job` at its address.

        The tasks of a job share this machine: each is told its local rank
        among them, so a worker takes its own device.
        """
        env = {
            **self.env,
            "LOCAL_RANK": str(index),
            "LOCAL_WORLD_SIZE": str(len(self.addresses[job])),
        }
        self.servers[(job, index)] = self.tasks.start(
            f"{job} {index} at {self.addresses[job][index]}",
            [*self.command, f"--job_name={job}", f"--task_index={index}"],
            env,
        )

    def start_each_server(self):
        """Starts every ps and worker task."""
        for job, addresses in self.addresses.items():
            for index in range(len(addresses)):
                self.start_server(job, index)

    def start_servers(self, timeout, signals):
        """Starts every ps and worker; returns once all of them serve."""
        self.start_each_server()
        deadline = time.monotonic() + timeout
        for (job, index), process in self.servers.items():
            host, port = self.addresses[job][index].rsplit(":", 1)
            while not _accepts(host, int(port)):
                if process.poll() is not None:
                    raise LaunchError(
                        f"{job} {index} exited with code {process.returncode} "
                        "before serving (see its messages above)"
                    )
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"{job} {index} did not serve within {timeout:.0f}s"
                    )
                if signals.received:
                    raise LaunchError(f"{signals.received[0]} while starting")
                time.sleep(processes.POLL_SECS)

    def start_coordinator(self):
        self.coordinator = self.tasks.start(
            "coordinator",
            [
                *self.command,
                "--job_name=chief",
                "--distribution=parameter_server",
            ],
            self.env,
        )

    def dead_server(self):
        """`(job, index, returncode)` of a server that exited, else None."""
        for (job, index), process in self.servers.items():
            if process.poll() is not None:
                return job, index, process.returncode
        return None

    def stop(self):
        """Terminates every task (the servers never exit by themselves)."""
        self.tasks.stop()


def _accepts(host, port):
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


class Restarts:
    """The restarts left to the whole run (`--max_restarts`)."""

    def __init__(self, limit):
        self.limit = limit
        self.used = 0

    def take(self):
        """Uses one restart; False when none is left."""
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def __str__(self):
        return f"restart {self.used} of {self.limit}"


RESTART_CLUSTER = "restart the cluster"


def supervise(cluster, signals, restarts, args):
    """Waits for the coordinator, restarting dead workers.

    A first signal is forwarded to the coordinator (SIGINT as SIGINT, the
    others as SIGTERM: checkpoint and exit); a second one, or
    `args.stop_timeout_secs`, kills it.

    Returns:
      The launcher's exit code, or `RESTART_CLUSTER` after a ps died.
    """
    coordinator = cluster.coordinator
    forwarded_at = None
    while coordinator.poll() is None:
        dead = cluster.dead_server()
        if dead and not signals.received:
            job, index, code = dead
            if not restarts.take():
                log(
                    f"{job} {index} exited with code {code} and no restart is "
                    f"left (--max_restarts={restarts.limit}); stopping the "
                    "cluster"
                )
                return 1
            if job == "worker":
                log(f"worker {index} exited with code {code}; restarting it "
                    f"({restarts})")  # fmt: skip
                cluster.start_server(job, index)
            else:
                log(f"{job} {index} exited with code {code}; its variables "
                    "are lost, restarting the cluster from the last checkpoint "
                    f"({restarts})")  # fmt: skip
                _await_exit(coordinator, args.ps_failure_secs)
                return RESTART_CLUSTER
        if signals.received and forwarded_at is None:
            log(f"{signals.received[0]}: asking the coordinator to stop")
            # It checkpoints and exits with 128 + the signal number.
            coordinator.send_signal(signals.to_forward())
            forwarded_at = time.monotonic()
        elif forwarded_at is not None and (
            len(signals.received) > 1
            or time.monotonic() - forwarded_at > args.stop_timeout_secs
        ):
            log("killing the coordinator")
            coordinator.kill()
        time.sleep(processes.POLL_SECS)
    code = coordinator.returncode
    log(f"coordinator exited with code {code}")
    return processes.exit_code(code)


def _await_exit(process, timeout):
    """Waits for `process` to exit by itself, else kills it; logs how."""
    try:
        process.wait(timeout)
        log(f"coordinator exited with code {process.returncode}")
    except subprocess.TimeoutExpired:
        log(f"coordinator still running after {timeout:.0f}s; killing it")
        process.kill()
        process.wait()


def dry_run(args):
    """Every task prints its plan and exits: no server waits for the others.

    Returns:
      The first non-zero exit code of a task, else 0.
    """
    cluster = Cluster(args.main, args.main_flags, args.num_ps, args.num_workers)
    cluster.start_each_server()
    cluster.start_coordinator()
    try:
        tasks = [*cluster.servers.values(), cluster.coordinator]
        codes = [task.wait() for task in tasks]
    finally:
        cluster.stop()
    return next((code for code in codes if code), 0)


def main(argv=None):
    """Starts the cluster, trains, stops it; returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signals = processes.StopSignals()
    failed = private_network.apply_network_flag(args.network, LISTENERS, log)
    if failed:
        return failed
    if "--dry_run" in args.main_flags:
        return dry_run(args)
    restarts = Restarts(args.max_restarts)
    while True:
        cluster = Cluster(
            args.main, args.main_flags, args.num_ps, args.num_workers
        )
        try:
            cluster.start_servers(args.start_timeout_secs, signals)
            cluster.start_coordinator()
            outcome = supervise(cluster, signals, restarts, args)
        except LaunchError as error:
            log(f"error: {error}")
            outcome = 1
        finally:
            cluster.stop()
            log("all tasks stopped")
        if outcome != RESTART_CLUSTER:
            return outcome
        log("starting the cluster again")


if __name__ == "__main__":
    sys.exit(main())

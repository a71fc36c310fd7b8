"""Runs multi-worker training on an existing Ray cluster (Ray Train).

  ray start --head ...                       # once per cluster
  python -m tf_resnet.launch.ray --address=auto --num_workers=2 -- \
      --dataset=cifar10 --train_data_path='cifar-10-batches-bin/data_batch*' \
      --eval_data_path=cifar-10-batches-bin/test_batch.bin \
      --log_root=/shared/resnet_ray

The engine of the original Ray example, whose `--redis-address` (accepted
here as an alias of `--address`) pointed at the cluster's head. Ray Train's
`TensorflowTrainer` starts one actor per worker (`--gpus_per_worker` GPUs
and `--cpus_per_worker` CPUs each) and gives each the `TF_CONFIG` of a
MultiWorkerMirroredStrategy cluster (its node's IP, a free port, its world
rank as task index; worker 0 is the chief). Each actor then runs
`resnet_main.py <flags after -->` as a child process with that `TF_CONFIG`
and its local rank (`LOCAL_RANK`, `LOCAL_WORLD_SIZE`), so the workers are
the very processes `launch.tf_config_cluster` starts on one machine: the same
`--distribution=multi_worker` (added when none is given) or `averaging`.

Why a child process and not `resnet_main` in the actor: TensorFlow's
collectives and devices are fixed once per process, a Ray actor outlives
one attempt of the job, and a child's exit code says how training ended
(`resnet_main`: 2 bad flags or data, 3 diverged, 4 lost a peer).

Paths: each child runs in the launcher's working directory with the
Python that runs the Ray worker (the environment `ray start` ran in), so
the repository, the data and `--log_root` must be at the same paths on
every node, `--log_root` on storage all nodes share: the chief writes
checkpoints and summaries there, and every worker resumes from it.

Failures: a worker whose `resnet_main` fails, whose actor dies or whose
node is lost fails the attempt (Ray Train ends the other workers). The
launcher then starts all workers again, up to `--max_failures` times, and
they resume from the last checkpoint in `--log_root`; the steps since it
are trained again. Exit codes 2 and 3 of `resnet_main` (bad flags or data,
diverged training) would only repeat, so they end the run at once. Ray
Train 2.60's own `FailureConfig(max_failures)` retries every worker error
alike, hence each attempt runs with `max_failures=0` and the launcher
decides. The exit code is the failed worker's (0 when all finished).
Ray Train's own waits on the cluster's nodes end within the workers'
`--peer_timeout_secs` too (`bound_ray_train`): a retry that cannot
start after a lost node fails within the bound, not Ray Train's longer
defaults.

Like the other launchers, this module imports no TensorFlow (`launch`'s
docstring says what it imports) and no Ray until `main` runs; Ray is
imported there.
"""

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time

from tf_resnet import native_log, peer_watch
from tf_resnet.launch import cli, processes, tf_config_cluster

log = cli.logger("launch.ray")
# Where Ray is pinned, for the error when it is missing.
REQUIREMENTS = "requirements-latest.txt"
# resnet_main's exit codes that a restart would only repeat: bad flags or
# data (2), diverged training (3).
FINAL_EXIT_CODES = (2, 3)
# The name of Ray Train's run directory under --log_root.
RUN_NAME = "ray_train"
# How long a cluster's address may refuse or not answer (a head starting
# up), and how long connecting to it may take in all.
REACH_SECS = 10
CONNECT_SECS = 60


def parse_args(argv):
    """The launcher's own flags; those after `--` go to `resnet_main.py`."""
    parser = cli.Parser(
        log,
        prog="python -m tf_resnet.launch.ray",
        description="Starts --num_workers workers of "
        "--distribution=multi_worker (or averaging) on an existing Ray "
        "cluster with Ray Train. Flags after -- go to every resnet_main.py.",
    )
    parser.add_argument(
        "--address",
        "--redis-address",
        "--redis_address",
        dest="address",
        default="auto",
        help="The Ray cluster: auto (the one `ray start` started on this "
        "node, or RAY_ADDRESS) or HOST:PORT of its head. --redis-address, "
        "the original example's flag, is an alias.",
    )
    parser.add_argument(
        "--num_workers",
        type=int,
        required=True,
        help="Workers (Ray actors, each one resnet_main process). The "
        "original's --num_gpus=N is N workers with --gpus_per_worker=1.",
    )
    parser.add_argument(
        "--gpus_per_worker",
        type=float,
        default=0,
        help="GPUs of each worker (Ray sets CUDA_VISIBLE_DEVICES); 0: CPU.",
    )
    parser.add_argument(
        "--cpus_per_worker",
        type=float,
        default=1,
        help="CPUs Ray reserves for each worker.",
    )
    parser.add_argument(
        "--placement_strategy",
        choices=("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
        default="PACK",
        help="How Ray places the workers on nodes (Ray Train's default, "
        "PACK: as few nodes as fit). STRICT_SPREAD: one worker per node, "
        "the multi_worker layout of one process with all GPUs per machine.",
    )
    parser.add_argument(
        "--max_failures",
        type=int,
        default=3,
        help="How many times failed workers (a lost actor or node, a "
        "resnet_main that died) are all started again; they resume from the "
        "last checkpoint in --log_root. 0: the first failure ends the run.",
    )
    args = parser.parse_launcher_args(argv, dashes_required=True)
    if args.num_workers < 1:
        parser.error("--num_workers must be at least 1")
    if args.gpus_per_worker < 0 or args.cpus_per_worker <= 0:
        parser.error("--gpus_per_worker must be >= 0, --cpus_per_worker > 0")
    if args.max_failures < 0:
        parser.error("--max_failures must be at least 0")
    parser.check_engine(
        args,
        tf_config_cluster.WORKER_ENGINES,
        "Ray's workers form a TF_CONFIG cluster without ps and run",
    )
    return args


def worker_command(main, main_flags):
    """The command line of every worker's `resnet_main.py`, but the Python."""
    engine_flag = tf_config_cluster.worker_engine_flag(main_flags)
    return [main, *main_flags, *engine_flag]


class WorkerExit(RuntimeError):
    """A worker's `resnet_main` failed; `exit_code` says how (None: unknown)."""

    def __init__(self, message, exit_code=None):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):
        return (type(self), (str(self), self.exit_code))


def train_worker(config):
    """Ray Train's function on each worker: `resnet_main` as a child process.

    Runs in the worker actor, whose environment holds the `TF_CONFIG` Ray
    Train set. It must use only the standard library, this module and
    `processes` (both shipped by value): the workers need not import
    `tf_resnet`. The child dies with the actor, as a local launcher's
    processes die with it.

    Args:
      config: `cwd` and `command` (after the Python) of the child.

    Raises:
      WorkerExit: the child failed, or could not start.
    """
    from ray import train

    context = train.get_context()
    rank = context.get_world_rank()
    env = dict(os.environ)
    # Ray Train sets it for tf.keras 2; resnet_main runs Keras 3.
    env.pop("TF_USE_LEGACY_KERAS", None)
    env["LOCAL_RANK"] = str(context.get_local_rank())
    env["LOCAL_WORLD_SIZE"] = str(context.get_local_world_size())
    command = [sys.executable, *config["command"]]
    try:
        child = subprocess.Popen(
            command,
            cwd=config["cwd"],
            env=env,
            preexec_fn=processes.die_with(os.getpid()),
        )
    except OSError as error:
        raise WorkerExit(
            f"could not start {command[1]} in {config['cwd']} ({error}) on "
            f"the node of worker {rank}; the repository and the data must "
            "be at the same paths on every node"
        ) from None
    code = processes.exit_code(child.wait())
    if code != 0:
        raise WorkerExit(f"resnet_main exited with code {code}", code)


def failures(error):
    """`[(rank, exit code or None, first line)]` of each failed worker."""
    found = []
    for rank, failure in sorted(getattr(error, "worker_failures", {}).items()):
        base = getattr(failure, "_base_exc", failure)  # Ray's wrapper.
        line = next(iter(str(base).strip().splitlines()), type(base).__name__)
        code = getattr(base, "exit_code", None)
        if code is None:
            line = f"its actor or its node is gone ({line})"
        found.append((rank, code, line))
    if not found:  # The controller failed, not a worker.
        found.append((None, None, next(iter(str(error).splitlines()), "")))
    return found


def exit_code_of(found):
    """The launcher's exit code for the failed workers `found`.

    A worker's own failure, rather than 4 (resnet_main's code for a lost
    peer, what the others see); 1 when no worker left a code (its actor or
    node died).
    """
    codes = [code for _, code, _ in found if code]
    causes = [code for code in codes if code != 4]
    return (causes or codes or [1])[0]


def could_not_restart(found, lost_a_peer):
    """Whether an attempt after a lost peer failed before any worker ran.

    Such an attempt (`found` holds no worker's exit code: Ray Train's
    worker-group start timed out) had a worker placed on a node Ray still
    counts alive, the cut-off one: Ray drops it only after its health
    check (about a minute by default), and what the failed placements
    held is freed later still. Each further restart would wait out the
    start timeout again, past the bound, so the launcher ends the run
    then with 4, the same loss: a batch script retries on other nodes.
    """
    return lost_a_peer and not any(code for _, code, _ in found)


def check_resources(ray, args):
    """The cluster's error when it lacks the workers' CPUs or GPUs, or None."""
    total = ray.cluster_resources()
    needed = {
        "CPU": args.num_workers * args.cpus_per_worker,
        "GPU": args.num_workers * args.gpus_per_worker,
    }
    short = [
        f"{needed[name]:g} {name}s (it has {total.get(name, 0):g})"
        for name in needed
        if needed[name] > total.get(name, 0)
    ]
    if short:
        return (
            f"--num_workers={args.num_workers} need {' and '.join(short)}: "
            "add nodes, or lower --num_workers or the resources per worker"
        )
    return None


def bounded_waits(bound, environ, ray_defaults):
    """The Ray Train waits that the launcher bounds by `--peer_timeout_secs`.

    Ray counts a node whose link is cut alive until its GCS health check
    gives up on it, and places a worker of the retry that follows the
    lost peer there: that retry's group never starts, and Ray Train waits
    its worker-group start timeout for it, even after Ray drops the node
    (the placement waits on the cut node's answer; docs/reliability.md
    has the times). A worker left with no peer to end it (every worker on
    the cut node) is waited for by Ray Train's worker health check. Each
    is a wait on a silent node, which the bound of a worker waiting on a
    silent peer already limits: it becomes the shorter of Ray's default
    and the bound. A value the user set stays theirs: the environment
    variable is the knob Ray Train's own error names for it.

    Args:
      bound: the workers' `--peer_timeout_secs`.
      environ: the launcher's environment.
      ray_defaults: `{Ray Train's environment variable: its default secs}`.

    Returns:
      `{environment variable: seconds}` to set: those `environ` lacks
      whose default exceeds the bound.
    """
    return {
        name: bound
        for name, default in ray_defaults.items()
        if name not in environ and default > bound
    }


def bound_ray_train(main_flags):
    """Sets Ray Train's waits on nodes from the bound (`bounded_waits`).

    Before the first `fit`: the trainer passes these variables on to its
    controller and workers. Says in one line each what it set.
    """
    from ray.train.v2._internal import constants

    defaults = {
        constants.WORKER_GROUP_START_TIMEOUT_S_ENV_VAR: (
            constants.DEFAULT_WORKER_GROUP_START_TIMEOUT_S
        ),
        constants.WORKER_HEALTH_CHECK_TIMEOUT_S_ENV_VAR: (
            constants.DEFAULT_WORKER_HEALTH_CHECK_TIMEOUT_S
        ),
    }
    bound = cli.flag_value(main_flags, "peer_timeout_secs")
    for name, seconds in bounded_waits(bound, os.environ, defaults).items():
        os.environ[name] = f"{seconds:g}"
        log(
            f"{name}={seconds:g} (Ray Train's default {defaults[name]:g}): "
            f"no wait on a node outlasts --peer_timeout_secs={bound:g}; "
            "set the variable to choose another"
        )


def make_trainer(args, train, tensorflow):
    """One attempt: the `TensorflowTrainer` of all workers, no Ray retries."""
    log_root = cli.given_flag(args.main_flags, "log_root")
    resources = {"CPU": args.cpus_per_worker}
    if args.gpus_per_worker:
        resources["GPU"] = args.gpus_per_worker
    return tensorflow.TensorflowTrainer(
        train_worker,
        train_loop_config={
            "cwd": os.getcwd(),
            "command": worker_command(args.main, args.main_flags),
        },
        scaling_config=train.ScalingConfig(
            num_workers=args.num_workers,
            use_gpu=args.gpus_per_worker > 0,
            resources_per_worker=resources,
            placement_strategy=args.placement_strategy,
        ),
        run_config=train.RunConfig(
            name=RUN_NAME,
            # Ray Train's own run files; none in ~/ray_results.
            storage_path=os.path.abspath(log_root or "."),
            failure_config=train.FailureConfig(
                max_failures=0, controller_failure_limit=0
            ),
        ),
    )


def import_ray():
    """`(ray, ray.train)`, or None after one error.

    Ray Train's TensorFlow module, which imports TensorFlow (seconds, and
    its start-up lines), is checked here but imported only once a cluster
    answers (`main`).
    """
    # Every worker's lines, not one per group of equal lines; V2 API.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    try:
        import ray
        from ray import train

        if importlib.util.find_spec("ray.train.tensorflow") is None:
            raise ImportError("no module named 'ray.train.tensorflow'")
    except ImportError as error:
        log(
            f"error: this environment ({sys.executable}) lacks Ray Train "
            f"({error}); {REQUIREMENTS} pins it: "
            f"TF_RESNET_REQUIREMENTS={REQUIREMENTS} ./setup.sh env"
        )
        return None
    # The workers need not import tf_resnet: what they run goes by value.
    ray.cloudpickle.register_pickle_by_value(processes)
    if __name__ != "__main__":  # Imported: ship this module too.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray, train


def run(ray, train, tensorflow, args):
    """Runs attempts until one ends; returns the launcher's exit code."""
    log_root = cli.given_flag(args.main_flags, "log_root")
    restarts, lost_a_peer = 0, False
    while True:
        log(
            f"starting {args.num_workers} worker(s)"
            + (
                f" (restart {restarts} of {args.max_failures})"
                if restarts
                else ""
            )
        )
        try:
            make_trainer(args, train, tensorflow).fit()
        except train.TrainingFailedError as error:
            found = failures(error)
            for rank, _, line in found:
                log(f"{'the controller' if rank is None else f'worker {rank}'}"
                    f": {line}")  # fmt: skip
            code = exit_code_of(found)
            if code in FINAL_EXIT_CODES:
                log(
                    f"error: resnet_main exited with code {code} (bad flags "
                    "or data, or diverged training: see its message above); "
                    "a restart would fail the same way, none is tried"
                )
                return code
            if could_not_restart(found, lost_a_peer):
                log(
                    "error: the workers could not start again after losing "
                    "a peer (Ray still counts the lost node); rerun the same "
                    "command when the nodes are back, or on others, to "
                    "resume from the last checkpoint in "
                    f"--log_root={log_root}"
                )
                return peer_watch.LOST_PEER
            if restarts >= args.max_failures:
                log(
                    "error: the workers failed and no restart is left "
                    f"(--max_failures={args.max_failures}); rerun the same "
                    "command to resume from the last checkpoint in "
                    f"--log_root={log_root}"
                )
                return code
            lost_a_peer = lost_a_peer or code == peer_watch.LOST_PEER
            restarts += 1
            log("restarting every worker; they resume from the last "
                f"checkpoint in --log_root={log_root}")  # fmt: skip
            continue
        log("every worker finished")
        return 0


def _no_cluster(address, why):
    """The one error line of a launcher that found no cluster."""
    return (
        f"error: no Ray cluster at --address={address} ({why}); start one "
        "with `ray start --head` on the head node, or pass the address it "
        "printed (`ray status` on a node of the cluster shows it; "
        'docs/distributed.md, "Ray")'
    )


def unreachable(address, wait_secs=REACH_SECS):
    """Why nothing answers at `host:port`, or None (also for `auto`).

    Ray itself retries an address with no cluster for minutes, printing a
    warning every few seconds; a port that refuses or a host that does not
    answer within `wait_secs` is said at once instead.
    """
    host, _, port = address.rpartition("://")[2].rpartition(":")
    if not host or not port.isdigit():
        return None
    deadline = time.monotonic() + wait_secs
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=5):
                return None
        except OSError as error:
            if time.monotonic() >= deadline:
                return f"nothing answers at {host}:{port}: {error}"
        time.sleep(1)


def connect(ray, address):
    """`ray.init` on the cluster at `address`; its error line, or None.

    Gives up after `CONNECT_SECS` whatever Ray is doing (an address that
    answers but is no Ray head, a stale `auto`): `ray.init` cannot be
    interrupted, so the launcher exits from a timer.
    """
    target = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    why = unreachable(target)
    if why:
        return _no_cluster(address, why)

    def give_up():
        log(_no_cluster(address, f"no answer within {CONNECT_SECS} s"))
        os._exit(2)

    timer = threading.Timer(CONNECT_SECS, give_up)
    timer.daemon = True
    timer.start()
    try:
        ray.init(address=address, log_to_driver=True)
    except (ConnectionError, ValueError, RuntimeError) as error:
        return _no_cluster(address, str(error).strip().splitlines()[0])
    finally:
        timer.cancel()
    return None


def main(argv=None):
    """Connects to the Ray cluster, trains; returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # Ray prints its actors' lines here: TensorFlow's import notices in each.
    native_log.filter_stderr()
    modules = import_ray()
    if modules is None:
        return 2
    ray, train = modules
    problem = connect(ray, args.address)
    if problem:
        log(problem)
        return 2
    try:
        problem = check_resources(ray, args)
        if problem:
            log(f"error: {problem}")
            return 2
        from ray.train import tensorflow

        bound_ray_train(args.main_flags)
        return run(ray, train, tensorflow, args)
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())

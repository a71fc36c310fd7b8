"""The registry of distribution engines: every fact of each, in one entry.

An engine is one value of `--distribution`. Its `Engine` entry says
everything the rest of the project needs to know about it: how its
distributor is made, how `auto` recognises a process started for it, its
constraints, its launcher, how its processes are counted, which devices
each takes, whose gradients make an update, what it needs installed and
whether some of its processes only serve. Start-up (`runtime.start`)
turns `--distribution` into one `Engine` once; `devices`, `dry_run`,
`distributors`, the launchers and the scaling model read its fields, and
none of them looks an engine up by its name or tests the name.

Modes are made by functions of this module that import their engine's
module when called, so this registry (and the config that validates
against it) stays free of TensorFlow and Horovod.

A new engine is its distributor module, one entry here and, if it needs one, a
launcher. The training loop never learns which engine runs it.
"""

import dataclasses
import enum
import importlib.util
import os
import shlex
import sys
from collections.abc import Callable

from tf_resnet import detect, traffic
from tf_resnet.config import presets
from tf_resnet.errors import UserInputError

# Not an engine: `resolve` makes it one from the launcher, else `running`
# from the devices of the process (each engine's `fallback`).
AUTO = "auto"


class Devices(enum.Enum):
    """Which devices each process of an engine takes (`devices.plan`)."""

    # One process: the `--num_gpus` first GPUs (none: the CPU, split
    # into `--cpu_replicas` logical devices if asked).
    ASKED = "asked"
    # One process per device: the GPU of the local rank.
    RANK = "rank"
    # One process per node takes all its GPUs (or its `--num_gpus`
    # first); one GPU per process when several share the node.
    NODE = "node"
    # Worker tasks as `NODE`; the coordinator and ps tasks none.
    WORKER_TASKS = "worker tasks"


class Update(enum.Enum):
    """Whose replicas' gradients make one optimizer update."""

    ALL = "all"  # Every replica in sync: synchronous SGD.
    PROCESS = "process"  # This process's only: local steps.
    WORKER = "worker"  # One worker's, applied asynchronously.


@dataclasses.dataclass(frozen=True)
class Needs:
    """A package an engine imports that a requirement set lacks.

    Attributes:
      package: the import name.
      label: how messages name it.
      why: why it may be missing and how to install it.
    """

    package: str
    label: str
    why: str


HOROVOD = Needs(
    "horovod",
    "Horovod",
    "Horovod 0.28.1 builds against TensorFlow <= 2.18 only, so "
    "requirements-latest.txt has none. Install requirements.txt "
    "(./setup.sh env) for Horovod",
)


@dataclasses.dataclass(frozen=True)
class Engine:
    """One `--distribution` value.

    Attributes:
      name: the `--distribution` value.
      summary: what it does, for docs and messages.
      make: `(global_batch, dist, devices) -> base.Distributor`.
      recognise: `(dist or None) -> reason or None`: whether `auto` picks
        it for this process (horovodrun's ranks, `TF_CONFIG`, a Slurm job
        step: `detect`).
      fallback: `(replicas) -> bool`: whether `auto` picks it for a
        process no launcher started, by the replicas of its device plan.
      check: `(dist) -> None`, raising `UserInputError` on settings that
        contradict the engine.
      launcher: module of `tf_resnet.launch` that starts its processes.
      devices: which devices each process takes (`Devices`).
      workers: `(worker_hosts) -> int`: the processes of one step when no
        launcher gave ranks (`detect`); None: one.
      update: whose gradients make one update (`Update`).
      per_process: one process per replica, each its own model (Horovod
        ranks or workers of `launch.tf_config_cluster`), not tf.distribute
        replicas in one process.
      needs: what it imports that a requirement set may lack (`Needs`).
      without_needs: what to run instead where `needs` is missing.
      serve: `(dist) -> bool`: serves until killed and returns True when
        this process is only a server task.
      averaging: `(global_batch, dist, devices)`: the `averaging` distributor
        over this engine's all-reduce, for the engines that carry it.
      compresses: its gradient all-reduce runs on float16 copies under
        `--gradient_compression=fp16`; the engines without one refuse it.
      packs: what `--all_reduce_pack_bytes` sets in it; empty: it takes
        no pack size and refuses one.
      overlaps: its gradient all-reduce runs in buckets overlapped with
        the backward pass (`distribute.buckets`) unless
        `--nooverlap_all_reduce`; the engines without one refuse that flag.
      overlap_waits_for_a_thread: its collectives start on TensorFlow's
        inter-op threads: on one, which the backward pass holds, its
        buckets start only once the pass is over (the scaling model then
        schedules them after it; `runtime.inter_op_threads` gives an
        overlapping process a second one by default).
      traffic: what it sends between nodes for one update
        (`tf_resnet.traffic`), for the scaling model; None: one node.
      trains_alone: a process of it that no launcher started (and no
        cluster names) can train on its own, as one rank of Horovod; False:
        it needs its cluster, and such a process is refused (`alone`).
    """

    name: str
    summary: str
    make: Callable
    recognise: Callable | None = None
    fallback: Callable | None = None
    check: Callable | None = None
    launcher: str | None = None
    devices: Devices = Devices.ASKED
    workers: Callable | None = None
    update: Update = Update.ALL
    per_process: bool = False
    needs: Needs | None = None
    without_needs: str = ""
    serve: Callable | None = None
    averaging: Callable | None = None
    compresses: bool = False
    packs: str = ""
    overlaps: bool = False
    overlap_waits_for_a_thread: bool = False
    traffic: object = None
    trains_alone: bool = True

    @property
    def asynchronous(self):
        """Updates are one worker's, applied without waiting for others."""
        return self.update is Update.WORKER


# Each distributor's module is imported when the distributor is made
# (TensorFlow, Horovod), not with this registry.


def _default_distributor(global_batch, dist, devices):
    from tf_resnet.distribute import tf_strategy

    return tf_strategy.make_default_distributor(global_batch, dist, devices)


def _mirrored_distributor(global_batch, dist, devices):
    from tf_resnet.distribute import tf_strategy

    return tf_strategy.make_mirrored_distributor(global_batch, dist, devices)


def _horovod_distributor(global_batch, dist, devices):
    from tf_resnet.distribute import horovod_ranks

    return horovod_ranks.make_distributor(global_batch, dist, devices)


def _horovod_averaging_distributor(global_batch, dist, devices):
    from tf_resnet.distribute import horovod_ranks

    return horovod_ranks.make_averaging_distributor(global_batch, dist, devices)


def _multi_worker_distributor(global_batch, dist, devices):
    from tf_resnet.distribute import multi_worker

    return multi_worker.make_distributor(global_batch, dist, devices)


def _multi_worker_averaging_distributor(global_batch, dist, devices):
    from tf_resnet.distribute import multi_worker

    return multi_worker.make_averaging_distributor(global_batch, dist, devices)


def _parameter_server_distributor(global_batch, dist, devices):
    from tf_resnet.distribute import parameter_server

    return parameter_server.make_distributor(global_batch, dist, devices)


def _parameter_server_serve(dist):
    from tf_resnet.distribute import parameter_server

    return parameter_server.serve(dist)


def _averaging_distributor(global_batch, dist, devices):
    transport, _ = averaging_transport(dist)
    return ENGINES[transport].averaging(global_batch, dist, devices)


def _horovod_ranks(dist):
    del dist
    ranks, variable = detect.launcher_world_size()
    if ranks > 1:
        return f"started as one of {ranks} ranks ({variable})"
    return None


def _parameter_server_cluster(dist):
    if dist is not None and detect.server_job(dist.job_name):
        return f"--job_name={dist.job_name}"
    return "TF_CONFIG names ps tasks" if detect.tf_config_has_ps() else None


def _one_device_per_process(dist):
    if dist.num_gpus > 1 or dist.cpu_replicas > 1:
        raise UserInputError(
            f"--distribution={dist.distribution} runs one device per "
            "process: drop --num_gpus/--cpu_replicas and launch one rank per "
            "device with horovodrun -np N"
        )


def _check_averaging(dist):
    devices = max(dist.num_gpus, dist.cpu_replicas)
    if devices > 1:
        raise UserInputError(
            f"--distribution=averaging trains one process per device, not "
            f"{devices} devices in one process: run "
            + " or ".join(launcher_commands(devices))
        )


def _check_multi_worker(dist):
    if dist.ps_hosts or dist.job_name:
        raise UserInputError(
            "--distribution=multi_worker has no ps and no job names: drop "
            "--ps_hosts/--job_name (the cluster is --worker_hosts with "
            "--task_index, TF_CONFIG or Slurm)"
        )
    if dist.all_reduce_pack_bytes and not dist.overlap_all_reduce:
        raise UserInputError(
            "--all_reduce_pack_bytes splits multi_worker's all-reduce into "
            "packs, which overlap the backward pass: drop it with "
            "--nooverlap_all_reduce (one pack after the backward pass)"
        )
    if dist.cpu_replicas > 1:
        raise UserInputError(
            "--cpu_replicas is for --distribution=mirrored; a multi_worker "
            "worker runs one replica per GPU, or one on its CPU"
        )


def averaging_transport(dist):
    """Which all-reduce carries `averaging`, and why.

    TensorFlow's collectives in a multi-worker cluster (`detect`), unless
    horovodrun started the process; Horovod otherwise.
    """
    ranks, variable = detect.launcher_world_size()
    if ranks > 1:
        return "horovod", f"one of {ranks} ranks ({variable})"
    cluster = detect.multi_worker_cluster(dist.worker_hosts)
    if cluster:
        return "multi_worker", cluster
    return "horovod", "no multi-worker cluster"


# The engines whose all-reduce can carry `averaging`, and whose launchers
# can start its processes, in the order they are offered.
AVERAGING_TRANSPORTS = ("multi_worker", "horovod")


ENGINES = {
    engine.name: engine
    for engine in (
        Engine(
            "default",
            "one device: a GPU if asked for, else the CPU",
            _default_distributor,
            fallback=lambda replicas: replicas <= 1,
        ),
        Engine(
            "mirrored",
            "MirroredStrategy over this machine's GPUs (or --cpu_replicas)",
            _mirrored_distributor,
            fallback=lambda replicas: replicas > 1,
            compresses=True,
        ),
        Engine(
            "horovod",
            "synchronous all-reduce over Horovod ranks, one device each",
            _horovod_distributor,
            recognise=_horovod_ranks,
            check=_one_device_per_process,
            launcher="horovod",
            devices=Devices.RANK,
            per_process=True,
            needs=HOROVOD,
            averaging=_horovod_averaging_distributor,
            compresses=True,
            packs="HOROVOD_FUSION_THRESHOLD (an explicit one wins)",
            overlaps=True,
            traffic=traffic.ALL_REDUCE_EVERY_STEP,
        ),
        Engine(
            "averaging",
            "local steps, weights averaged every --average_every steps",
            _averaging_distributor,
            check=_check_averaging,
            launcher="tf_config_cluster",
            devices=Devices.RANK,
            workers=detect.cluster_workers,
            update=Update.PROCESS,
            per_process=True,
            needs=HOROVOD,
            without_needs="or run the workers without it: python -m "
            "tf_resnet.launch.tf_config_cluster --np=N -- "
            "--distribution=averaging ...",
            traffic=traffic.ALL_REDUCE_EVERY,
        ),
        Engine(
            "parameter_server",
            "asynchronous SGD: a coordinator, ps and worker tasks",
            _parameter_server_distributor,
            recognise=_parameter_server_cluster,
            launcher="ps",
            devices=Devices.WORKER_TASKS,
            workers=detect.ps_cluster_workers,
            update=Update.WORKER,
            serve=_parameter_server_serve,
            traffic=traffic.PUSH_PULL,
            trains_alone=False,
        ),
        Engine(
            "multi_worker",
            "synchronous all-reduce with MultiWorkerMirroredStrategy",
            _multi_worker_distributor,
            recognise=lambda dist: detect.multi_worker_cluster(),
            check=_check_multi_worker,
            launcher="tf_config_cluster",
            devices=Devices.NODE,
            workers=detect.cluster_workers,
            averaging=_multi_worker_averaging_distributor,
            compresses=True,
            packs="CommunicationOptions(bytes_per_pack)",
            overlaps=True,
            overlap_waits_for_a_thread=True,
            traffic=traffic.ALL_REDUCE_EVERY_STEP,
            trains_alone=False,
        ),
    )
}
# `auto` is no engine: it becomes one of them (`resolve`, `running`).
DISTRIBUTIONS = (AUTO, *ENGINES)
# `--gradient_compression`: Horovod's names (`hvd.Compression.fp16`).
NO_COMPRESSION = "none"
GRADIENT_COMPRESSIONS = (NO_COMPRESSION, "fp16")


def check_settings(engine, dist):
    """Whether the distribution settings `dist` suit `engine`.

    The knobs of a gradient all-reduce (the engine's `compresses`,
    `packs` and `overlaps`), then the engine's own `check`.

    Raises:
      UserInputError: a knob the engine does not take, naming the engines
        that do; or the engine's own refusal.
    """
    knobs = (
        ("gradient_compression", NO_COMPRESSION, "compresses"),
        ("all_reduce_pack_bytes", 0, "packs"),
        ("overlap_all_reduce", True, "overlaps"),
    )
    for flag, unset, fact in knobs:
        value = getattr(dist, flag)
        if value != unset and not getattr(engine, fact):
            takers = [e.name for e in ENGINES.values() if getattr(e, fact)]
            raise UserInputError(
                f"--{flag}={value} is for a gradient all-reduce; "
                f"--distribution={engine.name} has none that takes it "
                f"(engines that do: {', '.join(takers)})"
            )
    if engine.check:
        engine.check(dist)


def installed(engine):
    """Whether the package the engine needs is importable here."""
    return (
        not engine.needs
        or importlib.util.find_spec(engine.needs.package) is not None
    )


def running(name, replicas):
    """The engine a process of `--distribution=name` runs.

    The one named; for `auto` that start-up could not resolve from the
    launcher, the engine whose `fallback` takes the process's devices.

    Args:
      name: the resolved `--distribution` value (`resolve`).
      replicas: the replicas of the process's device plan.
    """
    if name != AUTO:
        return get(name)
    return next(
        e for e in ENGINES.values() if e.fallback and e.fallback(replicas)
    )


def devices_rule(name):
    """How a process of the engine `name` (or of `auto`) takes devices.

    `auto` that start-up could not resolve runs one process: the devices
    asked for, as its `fallback` engines do.
    """
    return Devices.ASKED if name == AUTO else get(name).devices


def processes_in_sync(engine, worker_hosts=()):
    """Processes whose replicas one step of `engine` spans.

    Horovod ranks (whatever the engine: `resolve` allows only the engines
    that run on them); else the engine's own count of its workers
    (`Engine.workers`); else 1.
    """
    ranks, _ = detect.launcher_world_size()
    if ranks > 1:
        return ranks
    if engine.workers is None:
        return 1
    return engine.workers(worker_hosts) or 1


def launched_by(launcher):
    """The engines whose processes the `tf_resnet.launch` module starts."""
    return tuple(e.name for e in ENGINES.values() if e.launcher == launcher)


def get(name):
    """The engine named `name`; `UserInputError` for an unknown one."""
    if name not in ENGINES:
        raise UserInputError(
            f"unknown --distribution={name}; known: {', '.join(DISTRIBUTIONS)}"
        )
    return ENGINES[name]


def resolve(distribution, preset=None, dist=None):
    """The engine `--distribution` names, `auto` resolved; and why.

    `auto` asks each engine in turn whether the process was started for it
    (`Engine.recognise`); if none says so it stays `auto`, which becomes
    the `fallback` engine of the process's devices when its distributor is made.

    Args:
      distribution: the resolved `--distribution` value.
      preset: the run's `--preset`, named as the reason when it set it.
      dist: the `settings.DistributionConfig`, for flags that name a task.

    Returns:
      `(name, reason)`.

    Raises:
      UserInputError: an engine that contradicts the launcher (one process
        of several started by horovodrun told to train on its own).
    """
    ranks, variable = detect.launcher_world_size()
    on_ranks = [name for name, e in ENGINES.items() if e.per_process]
    if ranks > 1 and distribution not in (*on_ranks, AUTO):
        raise UserInputError(
            f"--distribution={distribution} in one of {ranks} processes "
            f"started by horovodrun/mpirun ({variable}={ranks}): each would "
            "train on its own into the same --log_root; use "
            f"--distribution={' or '.join(on_ranks)} (or leave it at auto)"
            + (
                "; srun --mpi=none starts the tasks of a job step without MPI"
                if variable.startswith(detect.PMIX_RANK)
                else ""
            )
        )
    if distribution != AUTO:
        if presets.PRESETS.get(preset, {}).get("distribution") == distribution:
            return distribution, f"--preset={preset}"
        return distribution, "--distribution"
    for engine in ENGINES.values():
        reason = engine.recognise(dist) if engine.recognise else None
        if reason:
            return engine.name, reason
    return AUTO, "one process"


def launcher_commands(processes, argv=None):
    """The launcher command lines that run `argv` as `processes` processes.

    `argv` (default `sys.argv`) without `--num_gpus`/`--cpu_replicas`,
    behind the launcher of each transport of `averaging`; Horovod's only
    where Horovod is installed.
    """
    argv = sys.argv if argv is None else argv
    flags, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg in ("--num_gpus", "--cpu_replicas"):
            skip = True  # `--num_gpus 4`: its value follows.
        elif not arg.startswith(("--num_gpus=", "--cpu_replicas=")):
            flags.append(arg)
    if not any(f.startswith("--distribution") for f in flags):
        flags.append("--distribution=averaging")
    return [
        _launch_command(ENGINES[name], processes, [argv[0], *flags])
        for name in AVERAGING_TRANSPORTS
        if installed(ENGINES[name])
    ]


def _launch_command(engine, processes, argv):
    """The command that runs `argv` as `processes` processes of `engine`.

    On this machine, through the engine's launcher, with the interpreter
    that runs now (a bare `python` may be one without TensorFlow).
    """
    main = os.path.basename(argv[0]) if argv else "resnet_main.py"
    main_flag = [] if main == "resnet_main.py" else [f"--main={argv[0]}"]
    count = (
        ["--num_ps=1", f"--num_workers={processes}"]
        if engine.serve
        else [f"--np={processes}"]
    )
    return shlex.join(
        [detect.interpreter(), "-m", f"tf_resnet.launch.{engine.launcher}"]
        + [*count, *main_flag, "--", *argv[1:]]
    )


def alone(engine, reason, dist, argv=None):
    """What to say when a process of a multi-process engine has no peers.

    An engine with a launcher trains over the processes that launcher
    starts; a process none started (and no cluster names) is alone. One
    that `trains_alone` (Horovod) then trains on one process, the same
    optimisation at the same global batch, only slower, which a student
    who typed `--preset=course_sync_cifar100` would take for a run on
    several: the returned warning says so and gives the launcher's
    command. The others need their cluster, so they are refused with it.

    Args:
      engine: the `Engine` start-up resolved.
      reason: why it runs (`runtime.start`'s, e.g. `--preset=...`).
      dist: the `settings.DistributionConfig`.
      argv: the command line (default `sys.argv`).

    Returns:
      The warning, or None when the process has peers or needs none.

    Raises:
      UserInputError: an engine that does not train alone, alone.
    """
    _, variable = detect.launcher_world_size()
    if (
        engine.launcher is None
        or variable
        or (engine.workers and engine.workers(dist.worker_hosts))
    ):
        return None
    argv = sys.argv if argv is None else argv
    command = _launch_command(engine, 2, argv)
    where = "on a cluster, its batch job (docs/recipes.md, Commands)"
    named = f"--distribution={engine.name}" + (
        "" if reason == "--distribution" else f" ({reason})"
    )
    if not engine.trains_alone:
        raise UserInputError(
            f"{named} runs as processes that a launcher starts "
            f"({engine.summary}), and none started this one; on this "
            f"machine: {command}; {where}"
        )
    return (
        f"one process: {named} is "
        "synchronous SGD over the processes its launcher starts, and no "
        "launcher started this one, so it trains alone (the same updates "
        "as on N processes, only slower); for 2 processes on this "
        f"machine: {command}; {where}"
    )

"""The registry of distribution engines: every fact of each, in one record.

An engine is one value of `--distribution`. Its `Engine` record says
everything the rest of the project needs to know about it: how its
distributor is made, how `auto` recognises a process started for it, its
constraints, its launcher, how its processes are counted, which devices
each takes, whose gradients make an update, what it needs installed,
whether some of its processes only serve, what it sends between nodes and
what carries that on a GPU cluster. Start-up (`startup`, called by
`runtime.start`) turns `--distribution` into one `Engine` once; the
devices, `dry_run`, the distributors, the launchers, the scaling model and
the benchmarks read its fields, and none of them looks an engine up by a
name of its own or tests the name.

A distributor's module (TensorFlow, Horovod) is named by a `Call`, imported
only when the distributor is made, so this registry (and the config that
validates against it) stays free of TensorFlow and of `distribute/`.

A new engine is one `register(Engine(...))` in a module of its own (its
distributor beside it or in `distribute/`), imported before the flags are
defined; `tests/dummy_engine.py` is one. The training loop never learns
which engine runs it.
"""

import dataclasses
import enum
import importlib
import importlib.util
import os
import shlex
import sys
from collections.abc import Callable

from tf_resnet import detect, traffic
from tf_resnet.engines.devices import Devices
from tf_resnet.errors import UserInputError


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


HOROVOD_PACKAGE = Needs(
    "horovod",
    "Horovod",
    "Horovod 0.28.1 builds against TensorFlow <= 2.18 only, so "
    "requirements-latest.txt has none. Install requirements.txt "
    "(./setup.sh env) for Horovod",
)


@dataclasses.dataclass(frozen=True)
class Transport:
    """What carries an engine's traffic on a GPU cluster (`tf_resnet.scaling`).

    Attributes:
      name: the all-reduce it is, as the benchmarks key their sweeps of
        it (`bench/network_jobs.py`).
      launcher: the `tf_resnet.launch` module whose processes it connects,
        as the benchmarks start them.
      share: its bandwidth over the calibrated all-reduce's
        (`calibration.Calibration.share`, NCCL's on GPUs).
      why: where that comes from.
      cycle_ms: Horovod's cycle, where Horovod carries it: every tensor
        and group ready within one cycle goes as one fused all-reduce
        (`HOROVOD_CYCLE_TIME`, 1 ms in 0.28.1; groups fuse across unless
        `HOROVOD_DISABLE_GROUP_FUSION`), so the engine's buckets are
        fused again; 0: each bucket is an all-reduce of its own.
    """

    name: str
    launcher: str
    share: float
    why: str
    cycle_ms: float = 0.0


_NCCL = "NCCL on GPUs, as calibrated on published clusters"
HOROVOD_ALL_REDUCE = Transport(
    "horovod", "horovod", 1.0, _NCCL + ", through Horovod", cycle_ms=1.0
)
# MultiWorkerMirroredStrategy picks NCCL on GPUs: a launch per pack.
COLLECTIVES = Transport("multi_worker", "tf_config_cluster", 1.0, _NCCL)
GRPC = Transport(
    "grpc",
    "ps",
    0.66 / 0.95,
    "gRPC: one worker's pull and push over Horovod's all-reduce on the "
    "same emulated links (bench/results/network_scaling.md); no "
    "published GPU figure",
)


@dataclasses.dataclass(frozen=True)
class Call:
    """A module's function, the module imported only when it is called.

    How a record names its distributor's maker: the registry stays free of
    TensorFlow and Horovod, and imports nothing of `distribute/`
    (`tests/test_schema.py` checks that each names a function).
    """

    module: str
    function: str

    def __call__(self, *args):
        return getattr(importlib.import_module(self.module), self.function)(
            *args
        )


@dataclasses.dataclass(frozen=True)
class Engine:
    """One `--distribution` value.

    Attributes:
      name: the `--distribution` value.
      summary: what it does, for docs and messages.
      make: `(optim, dist, devices) -> base.Distributor` (a `Call`).
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
      serve: `(dist, log_root) -> bool`: serves until the process ends
        and returns True when this process is only a server task.
      averaging: `(optim, dist, devices)`: the `averaging` distributor
        over this engine's all-reduce, for the engines that carry it.
      rides_on: `(dist) -> (Engine, why)`: the engine whose all-reduce
        carries this one's, chosen by how the process was started; its
        distributor is that engine's `averaging`. None: its own `make`.
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
      transport: what carries that traffic on a GPU cluster (`Transport`).
      trains_alone: a process of it that no launcher started (and no
        cluster names) can train on its own, as one rank of Horovod; False:
        it needs its cluster, and such a process is refused (`alone`).
      one_all_reduce: what its one all-reduce after the backward pass
        (`--nooverlap_all_reduce`) is called in its own library's words,
        as the benchmarks name that row.
      scripts: `(label, script)` of the plain scripts over its library
        that the benchmarks run beside its step, on its processes.
    """

    name: str
    summary: str
    make: Callable | None = None
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
    rides_on: Callable | None = None
    compresses: bool = False
    packs: str = ""
    overlaps: bool = False
    overlap_waits_for_a_thread: bool = False
    traffic: object = None
    transport: Transport | None = None
    trains_alone: bool = True
    one_all_reduce: str = "all-reduce"
    scripts: tuple = ()

    @property
    def asynchronous(self):
        """Updates are one worker's, applied without waiting for others."""
        return self.update is Update.WORKER


# Not an engine: start-up makes it one from the launcher, else from the
# devices of the process (each engine's `fallback`).
AUTO = "auto"
# Every engine by name, in the order `auto` asks them and `--distribution`
# offers them.
ENGINES = {}


def register(engine):
    """Adds `engine`; returns it. Before the flags are defined, to be a choice.

    Raises:
      ValueError: a name already registered, or traffic without a transport.
    """
    if engine.name in ENGINES:
        raise ValueError(f"engine {engine.name} is registered already")
    if engine.traffic and not engine.transport:
        raise ValueError(f"engine {engine.name} has traffic, no transport")
    ENGINES[engine.name] = engine
    return engine


def get(name):
    """The engine named `name`; `UserInputError` for an unknown one."""
    if name not in ENGINES:
        raise UserInputError(
            f"unknown --distribution={name}; known: "
            f"{', '.join((AUTO, *ENGINES))}"
        )
    return ENGINES[name]


def installed(engine):
    """Whether the package the engine needs is importable here."""
    return (
        not engine.needs
        or importlib.util.find_spec(engine.needs.package) is not None
    )


def launched_by(launcher):
    """The engines whose processes the `tf_resnet.launch` module starts."""
    return tuple(e.name for e in ENGINES.values() if e.launcher == launcher)


def across_nodes():
    """The engines that send something between nodes (`Engine.traffic`).

    Those whose all-reduce overlaps the backward pass first, then those
    that take local steps, then the others: the order in which the scaling
    model and the benchmarks show them.
    """
    sending = [e for e in ENGINES.values() if e.traffic]
    local = [e for e in sending if e.update is Update.PROCESS]
    overlapping = [e for e in sending if e.overlaps]
    rest = [e for e in sending if e not in local and e not in overlapping]
    return [*overlapping, *local, *rest]


def launch_command(engine, processes, argv):
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


# --- the engines -------------------------------------------------------


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


_HOROVOD_RANKS = "tf_resnet.distribute.horovod_ranks"
_MULTI_WORKER = "tf_resnet.distribute.multi_worker"
_TF_STRATEGY = "tf_resnet.distribute.tf_strategy"
_PARAMETER_SERVER = "tf_resnet.distribute.parameter_server"

HOROVOD = Engine(
    "horovod",
    "synchronous all-reduce over Horovod ranks, one device each",
    Call(_HOROVOD_RANKS, "make_distributor"),
    recognise=_horovod_ranks,
    check=_one_device_per_process,
    launcher="horovod",
    devices=Devices.RANK,
    per_process=True,
    needs=HOROVOD_PACKAGE,
    averaging=Call(_HOROVOD_RANKS, "make_averaging_distributor"),
    compresses=True,
    packs="HOROVOD_FUSION_THRESHOLD (an explicit one wins)",
    overlaps=True,
    traffic=traffic.ALL_REDUCE_EVERY_STEP,
    transport=HOROVOD_ALL_REDUCE,
    one_all_reduce="group",
    scripts=(("DistributedGradientTape script", "tape"),),
)
MULTI_WORKER = Engine(
    "multi_worker",
    "synchronous all-reduce with MultiWorkerMirroredStrategy",
    Call(_MULTI_WORKER, "make_distributor"),
    recognise=lambda dist: detect.multi_worker_cluster(),
    check=_check_multi_worker,
    launcher="tf_config_cluster",
    devices=Devices.NODE,
    workers=detect.cluster_workers,
    averaging=Call(_MULTI_WORKER, "make_averaging_distributor"),
    compresses=True,
    packs="CommunicationOptions(bytes_per_pack)",
    overlaps=True,
    overlap_waits_for_a_thread=True,
    traffic=traffic.ALL_REDUCE_EVERY_STEP,
    transport=COLLECTIVES,
    trains_alone=False,
    one_all_reduce="pack",
)
# The engines whose all-reduce can carry `averaging`, and whose launchers
# can start its processes, in the order they are offered.
AVERAGING_CARRIERS = (MULTI_WORKER, HOROVOD)


def averaging_carrier(dist):
    """Which engine's all-reduce carries `averaging`, and why.

    TensorFlow's collectives in a multi-worker cluster (`detect`), unless
    horovodrun started the process; Horovod otherwise.
    """
    ranks, variable = detect.launcher_world_size()
    if ranks > 1:
        return HOROVOD, f"one of {ranks} ranks ({variable})"
    cluster = detect.multi_worker_cluster(dist.worker_hosts)
    if cluster:
        return MULTI_WORKER, cluster
    return HOROVOD, "no multi-worker cluster"


def launcher_commands(processes, argv=None):
    """The launcher command lines that run `argv` as `processes` processes.

    `argv` (default `sys.argv`) without `--num_gpus`/`--cpu_replicas`,
    behind the launcher of each carrier of `averaging`; Horovod's only
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
        launch_command(engine, processes, [argv[0], *flags])
        for engine in AVERAGING_CARRIERS
        if installed(engine)
    ]


def _check_averaging(dist):
    devices = max(dist.num_gpus, dist.cpu_replicas)
    if devices > 1:
        raise UserInputError(
            f"--distribution=averaging trains one process per device, not "
            f"{devices} devices in one process: run "
            + " or ".join(launcher_commands(devices))
        )


for _engine in (
    Engine(
        "default",
        "one device: a GPU if asked for, else the CPU",
        Call(_TF_STRATEGY, "make_default_distributor"),
        fallback=lambda replicas: replicas <= 1,
    ),
    Engine(
        "mirrored",
        "MirroredStrategy over this machine's GPUs (or --cpu_replicas)",
        Call(_TF_STRATEGY, "make_mirrored_distributor"),
        fallback=lambda replicas: replicas > 1,
        compresses=True,
    ),
    HOROVOD,
    Engine(
        "averaging",
        "local steps, weights averaged every --average_every steps",
        check=_check_averaging,
        launcher="tf_config_cluster",
        devices=Devices.RANK,
        workers=detect.cluster_workers,
        update=Update.PROCESS,
        per_process=True,
        needs=HOROVOD_PACKAGE,
        without_needs="or run the workers without it: python -m "
        "tf_resnet.launch.tf_config_cluster --np=N -- "
        "--distribution=averaging ...",
        rides_on=averaging_carrier,
        traffic=traffic.ALL_REDUCE_EVERY,
        transport=HOROVOD_ALL_REDUCE,
    ),
    Engine(
        "parameter_server",
        "asynchronous SGD: a coordinator, ps and worker tasks",
        Call(_PARAMETER_SERVER, "make_distributor"),
        recognise=_parameter_server_cluster,
        launcher="ps",
        devices=Devices.WORKER_TASKS,
        workers=detect.ps_cluster_workers,
        update=Update.WORKER,
        serve=Call(_PARAMETER_SERVER, "serve"),
        traffic=traffic.PUSH_PULL,
        transport=GRPC,
        trains_alone=False,
    ),
    MULTI_WORKER,
):
    register(_engine)

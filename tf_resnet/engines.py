"""The registry of distribution engines: each one's name, factory, checks.

An engine is one value of `--distribution`. Its entry says everything the
rest of the project needs to know about it:

* `factory`: the `module:function` that makes its `base.DistributionMode`,
  imported only when the mode is made (so this registry, and the config
  that validates against it, stay free of TensorFlow and Horovod);
* `recognise`: how `--distribution=auto` knows that a process was started
  for it (horovodrun's ranks, `TF_CONFIG`, a Slurm job step: `detect`);
* `check`: its own constraints on the distribution settings;
* `launcher`: the `tf_resnet.launch` module that starts its processes on
  one machine;
* `server`: for clusters with tasks that only serve, the function that
  serves when this process is such a task.

A new engine is its mode module, one entry here and, if it needs one, a
launcher. The training loop never learns which engine runs it.
"""

import dataclasses
import importlib.util
import os
import shlex
import sys
from collections.abc import Callable

from tf_resnet import detect, recipes
from tf_resnet.errors import UserInputError


@dataclasses.dataclass(frozen=True)
class Engine:
    """One `--distribution` value.

    Attributes:
      name: the `--distribution` value.
      summary: what it does, for docs and messages.
      factory: `"module:function"` making the mode from `(global_batch,
        dist, devices)`; or a function of the `DistributionConfig` that
        returns one (an engine carried by one of several transports).
      recognise: `(dist or None) -> reason or None`: whether `auto` picks
        it for this process.
      check: `(dist) -> None`, raising `UserInputError` on settings that
        contradict the engine.
      launcher: module of `tf_resnet.launch` that starts its processes.
      update: whose replicas' gradients make one optimizer update: `all`
        in sync (synchronous SGD), this `process` only (local steps), or
        one `worker` of an asynchronous cluster.
      per_process: one process per replica, each its own model (Horovod
        ranks or workers of `launch.multi_worker`), not tf.distribute
        replicas in one process.
      needs: a package the factory imports that a requirement set lacks.
      without_needs: what to run instead where `needs` is missing.
      server: `"module:function"` of `(dist) -> bool`: serves until killed
        and returns True when this process is only a server task.
    """

    name: str
    summary: str
    factory: str | Callable
    recognise: Callable | None = None
    check: Callable | None = None
    launcher: str | None = None
    update: str = "all"
    per_process: bool = False
    needs: str | None = None
    without_needs: str = ""
    server: str | None = None

    def factory_path(self, dist):
        """The `module:function` making this engine's mode for `dist`."""
        if callable(self.factory):
            return self.factory(dist)
        return self.factory


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


def _averaging_factory(dist):
    transport, _ = averaging_transport(dist)
    module, _ = ENGINES[transport].factory.split(":")
    return f"{module}:make_averaging_mode"


ENGINES = {
    engine.name: engine
    for engine in (
        Engine(
            "default",
            "one device: a GPU if asked for, else the CPU",
            "tf_resnet.distribute.tf_strategy:make_default_mode",
        ),
        Engine(
            "mirrored",
            "MirroredStrategy over this machine's GPUs (or --cpu_replicas)",
            "tf_resnet.distribute.tf_strategy:make_mirrored_mode",
        ),
        Engine(
            "horovod",
            "synchronous all-reduce over Horovod ranks, one device each",
            "tf_resnet.distribute.horovod_mode:make_mode",
            recognise=_horovod_ranks,
            check=_one_device_per_process,
            launcher="horovod",
            per_process=True,
            needs="horovod",
        ),
        Engine(
            "averaging",
            "local steps, weights averaged every --average_every steps",
            _averaging_factory,
            check=_check_averaging,
            launcher="multi_worker",
            update="process",
            per_process=True,
            needs="horovod",
            without_needs="or run the workers without it: python -m "
            "tf_resnet.launch.multi_worker --np=N -- "
            "--distribution=averaging ...",
        ),
        Engine(
            "parameter_server",
            "asynchronous SGD: a coordinator, ps and worker tasks",
            "tf_resnet.distribute.parameter_server:make_mode",
            recognise=_parameter_server_cluster,
            launcher="ps",
            update="worker",
            server="tf_resnet.distribute.parameter_server:serve",
        ),
        Engine(
            "multi_worker",
            "synchronous all-reduce with MultiWorkerMirroredStrategy",
            "tf_resnet.distribute.multi_worker:make_mode",
            recognise=lambda dist: detect.multi_worker_cluster(),
            check=_check_multi_worker,
            launcher="multi_worker",
        ),
    )
}
# `auto` is no engine: it becomes one of them (`resolve`, `make_mode`).
DISTRIBUTIONS = ("auto", *ENGINES)


def installed(engine):
    """Whether the package the engine needs is importable here."""
    return (
        not engine.needs or importlib.util.find_spec(engine.needs) is not None
    )


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
    (`Engine.recognise`); if none says so it stays `auto`, which
    `make_mode` resolves by devices to `mirrored` or `default`.

    Args:
      distribution: the resolved `--distribution` value.
      preset: the run's `--preset`, named as the reason when it set it.
      dist: the `config.DistributionConfig`, for flags that name a task.

    Returns:
      `(name, reason)`.

    Raises:
      UserInputError: an engine that contradicts the launcher (one process
        of several started by horovodrun told to train on its own).
    """
    ranks, variable = detect.launcher_world_size()
    on_ranks = [name for name, e in ENGINES.items() if e.per_process]
    if ranks > 1 and distribution not in (*on_ranks, "auto"):
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
    if distribution != "auto":
        if recipes.PRESETS.get(preset, {}).get("distribution") == distribution:
            return distribution, f"--preset={preset}"
        return distribution, "--distribution"
    for engine in ENGINES.values():
        reason = engine.recognise(dist) if engine.recognise else None
        if reason:
            return engine.name, reason
    return "auto", "one process"


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
    main = os.path.basename(argv[0]) if argv else "resnet_main.py"
    main_flag = [] if main == "resnet_main.py" else [f"--main={argv[0]}"]
    launchers = [
        ENGINES[name].launcher
        for name in AVERAGING_TRANSPORTS
        if installed(ENGINES[name])
    ]
    return [
        shlex.join(
            ["python", "-m", f"tf_resnet.launch.{launcher}"]
            + [f"--np={processes}", *main_flag, "--", *flags]
        )
        for launcher in launchers
    ]

"""The engine a process runs, resolved once at start-up from how it began.

`resolve` turns `--distribution` (`auto` included) into an engine's name
and the reason, asking each record whether the process was started for it
(`Engine.recognise`); `running` makes the `auto` no launcher resolved the
engine its devices call for; `alone` says what to do with a process of a
multi-process engine that no launcher started. `runtime.start` calls
them and hands the record on; nothing after it resolves again.
"""

import sys

from tf_resnet import detect
from tf_resnet.engines import registry
from tf_resnet.engines.devices import Devices
from tf_resnet.errors import UserInputError


def running(name, replicas):
    """The engine a process of `--distribution=name` runs.

    The one named; for `auto` that start-up could not resolve from the
    launcher, the engine whose `fallback` takes the process's devices.

    Args:
      name: the resolved `--distribution` value (`resolve`).
      replicas: the replicas of the process's device plan.
    """
    if name != registry.AUTO:
        return registry.get(name)
    return next(
        e
        for e in registry.ENGINES.values()
        if e.fallback and e.fallback(replicas)
    )


def devices_rule(name):
    """How a process of the engine `name` (or of `auto`) takes devices.

    `auto` that start-up could not resolve runs one process: the devices
    asked for, as its `fallback` engines do.
    """
    return (
        Devices.ASKED if name == registry.AUTO else registry.get(name).devices
    )


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


def resolve(distribution, dist=None, named_by="--distribution"):
    """The engine `--distribution` names, `auto` resolved; and why.

    `auto` asks each engine in turn whether the process was started for it
    (`Engine.recognise`); if none says so it stays `auto`, which becomes
    the `fallback` engine of the process's devices (`running`).

    Args:
      distribution: the resolved `--distribution` value.
      dist: the `settings.DistributionConfig`, for flags that name a task.
      named_by: the reason of an engine named (`--preset=...` where the
        preset set it: `runtime.start`).

    Returns:
      `(name, reason)`.

    Raises:
      UserInputError: an engine that contradicts the launcher (one process
        of several started by horovodrun told to train on its own).
    """
    ranks, variable = detect.launcher_world_size()
    on_ranks = [e.name for e in registry.ENGINES.values() if e.per_process]
    if ranks > 1 and distribution not in (*on_ranks, registry.AUTO):
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
    if distribution != registry.AUTO:
        return distribution, named_by
    for engine in registry.ENGINES.values():
        reason = engine.recognise(dist) if engine.recognise else None
        if reason:
            return engine.name, reason
    return registry.AUTO, "one process"


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
    command = registry.launch_command(engine, 2, argv)
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

"""Start-up: what must be set before TensorFlow initialises, in order.

Thread pools, the device list and logical CPU devices are fixed the moment
TensorFlow creates its runtime, and the Keras dtype policy applies to the
layers built after it is set; so `start` runs before any model, dataset or
strategy exists. `resnet_main.py` and the benchmarks call it; settings that
belong to one distributor (Horovod's cycle time) live with that
distributor. Every engine's devices come from one plan (`devices.plan`).
"""

import dataclasses
import logging as std_logging
import os
import socket

import keras
import tensorflow as tf
from absl import logging

from tf_resnet import detect
from tf_resnet.config import engines, presets, schema
from tf_resnet.config.settings import DistributionConfig, OptimConfig
from tf_resnet.distribute import buckets
from tf_resnet.engines import devices, registry, startup
from tf_resnet.engines.distributors import make_distributor

# CPU flags of native bfloat16 matrix units: Intel's AMX tiles, and the
# AVX-512 BF16 dot products of Intel Cooper Lake+ and AMD Zen 4+. Without
# them TensorFlow emulates bfloat16 and it is slower than float32.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclasses.dataclass(frozen=True)
class Started:
    """What `start` set up.

    Attributes:
      dtype_policy: the Keras dtype policy in force (`auto` resolved).
      engine: the `registry.Engine` this process runs, resolved once here
        (`auto` by the launcher that started the process, else by its
        devices) and its settings checked: what is made of it
        (`distributors.make_distributor`) and what `--dry_run` tells.
      reason: why that engine (for the start line).
      by_devices: `auto` that no launcher resolved, so the engine is the
        one its devices call for.
      devices: devices to replicate over, `None` for the default device.
      plan: the `devices.Plan` they come from.
      inter_op_threads: the inter-op threads set (`inter_op_threads`; 0:
        TensorFlow's default).
    """

    dtype_policy: str
    engine: registry.Engine
    reason: str
    by_devices: bool
    devices: list | None
    plan: devices.Plan
    inter_op_threads: int = 0


def cpu_bf16_flags(cpuinfo="/proc/cpuinfo"):
    """The native-bfloat16 flags the CPU advertises (Linux; () if unknown)."""
    try:
        with open(cpuinfo, encoding="utf-8") as stream:
            for line in stream:
                if line.startswith("flags"):
                    flags = set(line.split())
                    return tuple(f for f in NATIVE_BF16_FLAGS if f in flags)
    except OSError:
        pass
    return ()


def resolve_dtype(name):
    """The Keras dtype policy of `--dtype`, with `auto` resolved.

    bfloat16 pays on CPUs with native bfloat16 units and TF's oneDNN
    kernels (bench/results/train_step.md and time_to_accuracy.md have the
    measurements on both CPU families);
    GPUs keep float32 unless asked, as mixed precision there is not
    measured on this project's machines.
    """
    if name != "auto":
        return name
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").lower()
    if (
        onednn not in ("0", "false")
        and not tf.config.list_physical_devices("GPU")
        and cpu_bf16_flags()
    ):
        return "mixed_bfloat16"
    return "float32"


def node_view(task_index=0):
    """What this process sees of its node: `devices.Node`."""
    count = len(tf.config.list_physical_devices("GPU"))
    rank, size, source = detect.local_process(task_index)
    return devices.Node(detect.gpu_ids(count), rank, size, source)


def device_plan(config, rule):
    """This process's `devices.Plan` by its engine's `Devices` rule."""
    dist = config.distribution
    return devices.plan(
        rule,
        dist.num_gpus,
        dist.cpu_replicas,
        node_view(dist.task_index),
        detect.server_job(dist.job_name),
    )


def apply_plan(plan):
    """Hands a device plan to TensorFlow, before it initialises.

    Keeps the plan's GPUs visible (with memory growth, so processes sharing
    a GPU in tests do not each reserve all of it), hides the others, and
    splits the CPU into logical devices if asked.

    Returns:
      The device names to replicate over, or `None` for the default device.
    """
    gpus = tf.config.list_physical_devices("GPU")
    kept = [gpus[index] for index in plan.gpus]
    for gpu in kept:
        tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(kept, "GPU")
    if plan.cpu_replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * plan.cpu_replicas
        )
    return plan.device_names


def configure_devices(num_gpus, cpu_replicas=1):
    """The devices of one process on its own (benchmarks, tests)."""
    return apply_plan(
        devices.plan(devices.Devices.ASKED, num_gpus, cpu_replicas, node_view())
    )


# TensorFlow modules whose INFO lines (absl's logger, which carries ours
# too) tell a user nothing: the checkpoint saver logs the time of an
# internal callback at every save; connecting to a cluster (the
# parameter-server coordinator) dumps the whole session config.
QUIET_MODULES = ("checkpoint/functional_saver.py", "eager/remote.py")


class _DropInternalInfo(std_logging.Filter):
    def filter(self, record):
        return record.levelno >= std_logging.WARNING or not (
            record.pathname.replace(os.sep, "/").endswith(QUIET_MODULES)
        )


def quiet_tensorflow_internals():
    """Keeps TensorFlow's internal INFO lines (`QUIET_MODULES`) off the log.

    Warnings and errors from those modules still show, and so does every
    line of ours: only INFO and below from the named files is dropped.
    """
    absl_logger = std_logging.getLogger("absl")
    if not any(isinstance(f, _DropInternalInfo) for f in absl_logger.filters):
        absl_logger.addFilter(_DropInternalInfo())


def usable_cores():
    """The cores this process may run on (its affinity, where known)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def inter_op_threads(asked, engine, dist, cores=None):
    """The inter-op threads of a process: `--inter_op_threads`, if set.

    Else TensorFlow's default (0: one per core), except on a process of
    fewer cores than an overlapped all-reduce needs threads
    (`buckets.INTER_OP_THREADS`): there it gets that many.

    Args:
      asked: `--inter_op_threads` (0: not set).
      engine: the `registry.Engine` the process runs.
      dist: its `DistributionConfig`.
      cores: the process's cores (default: `usable_cores()`).
    """
    if asked or not (engine.overlaps and dist.overlap_all_reduce):
        return asked
    cores = usable_cores() if cores is None else cores
    return buckets.INTER_OP_THREADS if cores < buckets.INTER_OP_THREADS else 0


def named_by(config):
    """Why a named engine runs: the `--preset` that set it, else the flag."""
    preset = presets.PRESETS.get(config.preset, {})
    if preset.get("distribution") == config.distribution.distribution:
        return f"--preset={config.preset}"
    return "--distribution"


def start(config):
    """Resolves the engine; sets threads, dtype policy, devices, determinism.

    Args:
      config: a validated `settings.Config`.

    Returns:
      `Started`.

    Raises:
      UserInputError: settings the engine that `auto` became does not
        take (`engines.check_settings`).
    """
    runtime, dist = config.runtime, config.distribution
    quiet_tensorflow_internals()
    # The engine, once: the launcher's, else by the devices of the plan.
    name, reason = startup.resolve(dist.distribution, dist, named_by(config))
    plan = device_plan(config, startup.devices_rule(name))
    engine = startup.running(name, plan.replicas)
    tf.config.threading.set_intra_op_parallelism_threads(
        runtime.intra_op_threads
    )
    threads = inter_op_threads(runtime.inter_op_threads, engine, dist)
    if threads != runtime.inter_op_threads:
        logging.info(
            "%d inter-op threads: one per core would leave the overlapped "
            "gradient all-reduce none beside the backward pass "
            "(--inter_op_threads sets them)",
            threads,
        )
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    policy = resolve_dtype(runtime.dtype)
    keras.config.set_dtype_policy(policy)
    names = apply_plan(plan)
    # Which host each process of a job runs on, in the job's log.
    logging.info(
        "process %d on host %s: %s",
        os.getpid(),
        socket.gethostname(),
        plan.describe(),
    )
    if dist.distribution == registry.AUTO:
        # A named engine's settings were checked with the others
        # (`validation.validate`); the one `auto` became is known only now.
        engines.check_settings(engine, dist)
    if runtime.deterministic:
        tf.config.experimental.enable_op_determinism()
    return Started(
        policy, engine, reason, name == registry.AUTO, names, plan, threads
    )


def distributor_for(distribution, global_batch, config=None, devices=None):
    """The distributor of a `--distribution` value, in a process of its own.

    For code that sets its devices itself instead of through start-up
    (benchmarks, tests): the engine is resolved and the settings checked
    as `runtime.start` does, then `make_distributor`.

    Args:
      distribution: a `--distribution` value (`engines.distributions()`);
        `auto` becomes the engine it falls back to for these devices
        (`startup.running`).
      global_batch: examples of one step over all replicas of all workers
        (the other settings of the batch plan at their defaults: no
        micro-batches, the default learning rate).
      config: the `settings.DistributionConfig` (None: defaults); checked
        against its schema and the engine's own constraints first.
      devices: the devices' names (None: the default device).

    Returns:
      A `base.Distributor`.
    """
    config = config or DistributionConfig()
    engine = startup.running(distribution, len(devices or ()) or 1)
    schema.check(config)
    engines.check_settings(engine, config)
    optim = OptimConfig(batch_size=global_batch)
    return make_distributor(engine, optim, config, devices)

"""Distribution modes: one class per mode, chosen by `--distribution`.

`make_mode` is the only place that knows the modes; everything else talks to
the `DistributionMode` interface in `base.py`.
"""

import tensorflow as tf

from tf_resnet.distribute import tf_strategy
from tf_resnet.errors import UserInputError

DISTRIBUTIONS = (
    "auto",
    "default",
    "mirrored",
    "horovod",
    "averaging",
    "parameter_server",
)
# One process per replica, launched by horovodrun/mpirun; Horovod is imported
# only when one of these is asked for, so other modes work without it.
HOROVOD_DISTRIBUTIONS = ("horovod", "averaging")


def configure_devices(num_gpus, cpu_replicas=1):
    """Checks GPUs and splits the CPU into logical devices if asked.

    Must run before TensorFlow initialises its devices.

    Args:
      num_gpus: GPUs to use; more than are visible is an error.
      cpu_replicas: logical CPU devices to create (for testing Mirrored
        training on a CPU-only machine).

    Returns:
      The device names to replicate over, or `None` for the default device.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if num_gpus > len(gpus):
        raise UserInputError(
            f"--num_gpus={num_gpus} but {len(gpus)} GPU(s) are visible "
            "to TensorFlow"
        )
    if num_gpus:
        for gpu in gpus[:num_gpus]:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[:num_gpus], "GPU")
        return [f"/gpu:{index}" for index in range(num_gpus)]
    if cpu_replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_replicas
        )
        return [f"/cpu:{index}" for index in range(cpu_replicas)]
    tf.config.set_visible_devices([], "GPU")
    return None


def make_mode(
    distribution="auto",
    num_gpus=0,
    cpu_replicas=1,
    average_every=1,
    cluster=None,
):
    """Creates the distribution mode named by `--distribution`.

    Args:
      distribution: `auto` (mirrored over several devices, else default),
        `default`, `mirrored`, `horovod` (synchronous all-reduce over
        processes), `averaging` (local steps, weights averaged over
        processes every `average_every` steps) or `parameter_server`.
      num_gpus: GPUs on this machine to use.
      cpu_replicas: logical CPU devices (used when `num_gpus == 0`).
      average_every: steps between weight averages of `averaging`.
      cluster: for `parameter_server`, the keyword arguments of
        `parameter_server.cluster_resolver` (`ps_hosts`, `worker_hosts`,
        `job_name`, `task_index`); empty or None: `TF_CONFIG`.

    Returns:
      A `base.DistributionMode`.
    """
    if distribution not in DISTRIBUTIONS:
        raise UserInputError(
            f"unknown --distribution={distribution}; known: "
            f"{', '.join(DISTRIBUTIONS)}"
        )
    if distribution in HOROVOD_DISTRIBUTIONS:
        return _horovod_mode(
            distribution, num_gpus, cpu_replicas, average_every
        )
    if distribution == "parameter_server":
        return _parameter_server_mode(cluster or {})
    devices = configure_devices(num_gpus, cpu_replicas)
    if distribution == "mirrored" or (
        distribution == "auto" and devices and len(devices) > 1
    ):
        return tf_strategy.mirrored_mode(devices)
    if devices:
        return tf_strategy.StrategyMode(
            tf.distribute.OneDeviceStrategy(devices[0]), "default"
        )
    return tf_strategy.default_mode()


def _horovod_mode(distribution, num_gpus, cpu_replicas, average_every):
    """A Horovod mode: one device per process, chosen by the local rank."""
    if num_gpus > 1 or cpu_replicas > 1:
        raise UserInputError(
            f"--distribution={distribution} runs one device per process: "
            "drop --num_gpus/--cpu_replicas and launch one rank per device "
            "with horovodrun -np N"
        )
    from tf_resnet.distribute import averaging, horovod_mode

    if distribution == "horovod":
        return horovod_mode.HorovodMode()
    return averaging.AveragingMode(average_every)


def _parameter_server_mode(cluster):
    """The coordinator of a ps/worker cluster (flags, else TF_CONFIG)."""
    from tf_resnet.distribute import parameter_server

    resolver = parameter_server.cluster_resolver(**cluster)
    return parameter_server.ParameterServerMode(resolver)

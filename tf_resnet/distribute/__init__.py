"""Distribution modes: one class per mode, chosen by `--distribution`.

`make_mode` is the only place that knows the modes; everything else talks to
the `DistributionMode` interface in `base.py`.
"""

import tensorflow as tf

from tf_resnet.distribute import tf_strategy
from tf_resnet.errors import UserInputError

DISTRIBUTIONS = ("auto", "default", "mirrored")


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


def make_mode(distribution="auto", num_gpus=0, cpu_replicas=1):
    """Creates the distribution mode named by `--distribution`.

    Args:
      distribution: `auto` (mirrored over several devices, else default),
        `default` or `mirrored`.
      num_gpus: GPUs on this machine to use.
      cpu_replicas: logical CPU devices (used when `num_gpus == 0`).

    Returns:
      A `base.DistributionMode`.
    """
    if distribution not in DISTRIBUTIONS:
        raise UserInputError(
            f"unknown --distribution={distribution}; known: "
            f"{', '.join(DISTRIBUTIONS)}"
        )
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

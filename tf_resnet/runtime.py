"""Start-up: what must be set before TensorFlow initialises, in order.

Thread pools, the device list and logical CPU devices are fixed the moment
TensorFlow creates its runtime, and the Keras dtype policy applies to the
layers built after it is set; so `start` runs before any model, dataset or
strategy exists. `resnet_main.py` and the benchmarks call it; settings that
belong to one distribution mode (Horovod's cycle time, its GPU pinning by
local rank) live with that mode.
"""

import dataclasses
import os

import keras
import tensorflow as tf

from tf_resnet import engines
from tf_resnet.errors import UserInputError

# CPU flags of native bfloat16 matrix units: Intel's AMX tiles, and the
# AVX-512 BF16 dot products of Intel Cooper Lake+ and AMD Zen 4+. Without
# them TensorFlow emulates bfloat16 and it is slower than float32.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclasses.dataclass(frozen=True)
class Started:
    """What `start` set up.

    Attributes:
      dtype_policy: the Keras dtype policy in force (`auto` resolved).
      distribution: the mode to make (`auto` resolved where the launcher
        tells; `auto` left for `make_mode` to choose by devices).
      reason: why that mode (for the start line).
      devices: devices to replicate over, `None` for the default device.
    """

    dtype_policy: str
    distribution: str
    reason: str
    devices: list | None


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
    kernels (bench/README.md has the measurements on both CPU families);
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


def configure_devices(num_gpus, cpu_replicas=1):
    """Checks GPUs and splits the CPU into logical devices if asked.

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


def start(config):
    """Sets threads, dtype policy, devices and determinism; in that order.

    Args:
      config: a validated `config.Config`.

    Returns:
      `Started`.
    """
    runtime, dist = config.runtime, config.distribution
    tf.config.threading.set_intra_op_parallelism_threads(
        runtime.intra_op_threads
    )
    tf.config.threading.set_inter_op_parallelism_threads(
        runtime.inter_op_threads
    )
    policy = resolve_dtype(runtime.dtype)
    keras.config.set_dtype_policy(policy)
    distribution, reason = engines.resolve(dist.distribution, config.preset)
    devices = None
    # Horovod ranks pin their device by local rank once Horovod runs; ps
    # and worker tasks and the ps coordinator use the cluster's devices.
    own = distribution != "auto" and engines.get(distribution).own_devices
    if not dist.is_server_task and not own:
        devices = configure_devices(dist.num_gpus, dist.cpu_replicas)
    if runtime.deterministic:
        tf.config.experimental.enable_op_determinism()
    return Started(policy, distribution, reason, devices)

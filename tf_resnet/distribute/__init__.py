"""Distribution modes: one class per mode, chosen by `--distribution`.

`make_mode` is the only place that knows the modes; everything else talks to
the `DistributionMode` interface in `base.py`.
"""

import tensorflow as tf

from tf_resnet.config import (
    DISTRIBUTIONS,
    HOROVOD_DISTRIBUTIONS,
    DistributionConfig,
)
from tf_resnet.distribute import tf_strategy
from tf_resnet.errors import UserInputError


def make_mode(distribution, global_batch, config=None, devices=None):
    """Creates the distribution mode named by `--distribution`.

    Args:
      distribution: `auto` (mirrored over several devices, else default),
        `default`, `mirrored`, `horovod` (synchronous all-reduce over
        processes), `averaging` (local steps, weights averaged over
        processes every `average_every` steps), `parameter_server` or
        `multi_worker` (synchronous all-reduce over processes with
        TensorFlow's MultiWorkerMirroredStrategy);
        `runtime.start` resolves `auto` where the launcher tells.
      global_batch: examples of one step over all replicas of all workers.
      config: the `config.DistributionConfig` (GPUs, CPU replicas,
        `average_every`, the parameter-server or multi-worker cluster,
        which also makes `averaging` use TensorFlow's collectives instead
        of Horovod: `averaging.engine`);
        None: defaults.
      devices: from `runtime.configure_devices` (None: default device).

    Returns:
      A `base.DistributionMode`.
    """
    config = config or DistributionConfig()
    if distribution not in DISTRIBUTIONS:
        raise UserInputError(
            f"unknown --distribution={distribution}; known: "
            f"{', '.join(DISTRIBUTIONS)}"
        )
    if distribution == "averaging":
        return _averaging_mode(global_batch, config)
    if distribution in HOROVOD_DISTRIBUTIONS:
        return _horovod_mode(distribution, global_batch, config)
    if distribution == "parameter_server":
        from tf_resnet.distribute import parameter_server

        resolver = parameter_server.cluster_resolver(**config.cluster)
        return parameter_server.ParameterServerMode(resolver, global_batch)
    if distribution == "multi_worker":
        from tf_resnet.distribute import multi_worker

        return multi_worker.make_mode(config, global_batch)
    if distribution == "mirrored" or (
        distribution == "auto" and devices and len(devices) > 1
    ):
        return tf_strategy.mirrored_mode(global_batch, devices)
    if devices:
        return tf_strategy.StrategyMode(
            tf.distribute.OneDeviceStrategy(devices[0]), "default", global_batch
        )
    return tf_strategy.default_mode(global_batch)


def _needs_horovod(distribution, hint=""):
    return UserInputError(
        f"--distribution={distribution} needs Horovod, which this "
        "environment lacks: Horovod 0.28.1 builds against TensorFlow "
        "<= 2.18 only, so requirements-latest.txt has none. Install "
        f"requirements.txt (./setup.sh env) for Horovod{hint}."
    )


def _averaging_mode(global_batch, config):
    """Averaging on TensorFlow's collectives or on Horovod ranks."""
    from tf_resnet.distribute import averaging

    try:
        return averaging.make_mode(config, global_batch)
    except ModuleNotFoundError as error:
        if error.name != "horovod":
            raise
        raise _needs_horovod(
            "averaging",
            ", or run the workers without it: python -m "
            "tf_resnet.launch.multi_worker --np=N -- --distribution=averaging "
            "...",
        ) from None


def _horovod_mode(distribution, global_batch, config):
    """Synchronous Horovod: one device per process, chosen by local rank."""
    if config.num_gpus > 1 or config.cpu_replicas > 1:
        raise UserInputError(
            f"--distribution={distribution} runs one device per process: "
            "drop --num_gpus/--cpu_replicas and launch one rank per device "
            "with horovodrun -np N"
        )
    try:
        from tf_resnet.distribute import horovod_mode
    except ModuleNotFoundError as error:
        if error.name != "horovod":
            raise
        raise _needs_horovod(distribution) from None
    return horovod_mode.HorovodMode(global_batch)

"""Distribution modes: one class per engine, chosen by `--distribution`.

The engines and what each needs are registered in `tf_resnet.engines`;
`make_mode` makes the chosen one's mode and everything else talks to the
`base.DistributionMode` interface. An engine's module is imported only
when its mode is made, so a run without Horovod never imports it.
"""

import importlib

from tf_resnet import engines, schema
from tf_resnet.config import DistributionConfig
from tf_resnet.errors import UserInputError


def _load(engine, path):
    """The function at `module:function`, or the engine's missing package."""
    module_name, function = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if not engine.needs or error.name != engine.needs:
            raise
        hint = f", {engine.without_needs}" if engine.without_needs else ""
        raise UserInputError(
            f"--distribution={engine.name} needs Horovod, which this "
            "environment lacks: Horovod 0.28.1 builds against TensorFlow "
            "<= 2.18 only, so requirements-latest.txt has none. Install "
            f"requirements.txt (./setup.sh env) for Horovod{hint}."
        ) from None
    return getattr(module, function)


def make_mode(distribution, global_batch, config=None, devices=None):
    """Creates the mode of the engine `distribution` names.

    Args:
      distribution: a `--distribution` value (`engines.DISTRIBUTIONS`);
        `auto` that start-up could not resolve from the launcher becomes
        `mirrored` over several devices, else `default`.
      global_batch: examples of one step over all replicas of all workers.
      config: the `config.DistributionConfig` (None: defaults); checked
        against its schema and the engine's own constraints first.
      devices: the device plan's names (`runtime.start`; None: the
        default device).

    Returns:
      A `base.DistributionMode`.
    """
    config = config or DistributionConfig()
    if distribution == "auto":
        distribution = "mirrored" if devices and len(devices) > 1 else "default"
    engine = engines.get(distribution)
    schema.check(config)
    if engine.check:
        engine.check(config)
    factory = _load(engine, engine.factory_path(config))
    return factory(global_batch, config, devices)


def serve(config):
    """Serves until killed if this process is only a server task.

    Returns:
      True after serving; False for a process that trains (or evaluates).
    """
    for engine in engines.ENGINES.values():
        if engine.server and _load(engine, engine.server)(config):
            return True
    return False

"""Makes the distribution mode of an engine: what the training loop runs on.

The engines and every fact of each are registered in `tf_resnet.config.engines`;
`make_mode` makes the chosen one's mode, and everything else talks to the
`distribute.base.DistributionMode` interface. An engine's module is
imported only when its mode is made, so a run without Horovod never
imports it.
"""

from tf_resnet.config import engines, schema
from tf_resnet.config.settings import DistributionConfig
from tf_resnet.errors import UserInputError


def _call(engine, function, *args):
    """`function(*args)`; one clear error if the engine lacks its package."""
    try:
        return function(*args)
    except ModuleNotFoundError as error:
        if not engine.needs or error.name != engine.needs.package:
            raise
        hint = f", {engine.without_needs}" if engine.without_needs else ""
        raise UserInputError(
            f"--distribution={engine.name} needs {engine.needs.label}, which "
            f"this environment lacks: {engine.needs.why}{hint}."
        ) from None


def make_mode(distribution, global_batch, config=None, devices=None):
    """Creates the mode of the engine `distribution` names.

    Args:
      distribution: a `--distribution` value (`engines.DISTRIBUTIONS`);
        `auto` that start-up could not resolve from the launcher becomes
        the engine it falls back to for these devices (`engines.running`).
      global_batch: examples of one step over all replicas of all workers.
      config: the `settings.DistributionConfig` (None: defaults); checked
        against its schema and the engine's own constraints first.
      devices: the device plan's names (`runtime.start`; None: the
        default device).

    Returns:
      A `base.DistributionMode`.
    """
    config = config or DistributionConfig()
    engine = engines.running(distribution, len(devices or ()) or 1)
    schema.check(config)
    engines.check_settings(engine, config)
    return _call(engine, engine.make, global_batch, config, devices)


def serve(config):
    """Serves until killed if this process is only a server task.

    Returns:
      True after serving; False for a process that trains (or evaluates).
    """
    for engine in engines.ENGINES.values():
        if engine.serve and _call(engine, engine.serve, config):
            return True
    return False

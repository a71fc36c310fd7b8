"""Makes an engine's distributor: what the training loop runs on.

The engines and every fact of each are registered in `registry`;
start-up resolves `--distribution` into one `Engine` and checks the
settings against it (`runtime.start`).
`make_distributor` makes that engine's distributor, and everything else
talks to the `distribute.base.Distributor` interface. An engine's module
is imported only when its distributor is made, so a run without Horovod
never imports it.
"""

from tf_resnet.config import engines, schema
from tf_resnet.config.settings import DistributionConfig
from tf_resnet.engines import startup
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


def make_distributor(engine, global_batch, config=None, devices=None):
    """Creates the distributor of `engine`, as start-up resolved it.

    Args:
      engine: the `registry.Engine` of `runtime.start` (`Started.engine`),
        whose settings it has checked.
      global_batch: examples of one step over all replicas of all workers.
      config: the `settings.DistributionConfig` (None: defaults).
      devices: the device plan's names (`Started.devices`; None: the
        default device).

    Returns:
      A `base.Distributor`: the engine's own, or, for an engine that rides
      on another's all-reduce (`Engine.rides_on`), that one's `averaging`.
    """
    config = config or DistributionConfig()
    make = engine.make
    if engine.rides_on:
        carrier, _ = engine.rides_on(config)
        make = carrier.averaging
    return _call(engine, make, global_batch, config, devices)


def distributor_for(distribution, global_batch, config=None, devices=None):
    """The distributor of a `--distribution` value, in a process of its own.

    For code that sets its devices itself instead of through start-up
    (benchmarks, tests): the engine is resolved and the settings checked
    as `runtime.start` does, then `make_distributor`.

    Args:
      distribution: a `--distribution` value (`engines.distributions()`);
        `auto` becomes the engine it falls back to for these devices
        (`startup.running`).
      global_batch: examples of one step over all replicas of all workers.
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
    return make_distributor(engine, global_batch, config, devices)


def serve(engine, config):
    """Serves until killed if this process is only a server task of `engine`.

    Args:
      engine: the `Engine` start-up resolved (`Started.engine`).
      config: the `settings.DistributionConfig`.

    Returns:
      True after serving; False for a process that trains (or evaluates).
    """
    return bool(engine.serve and _call(engine, engine.serve, config))

"""Makes an engine's distributor: what the training loop runs on.

The engines and every fact of each are registered in `registry`;
start-up resolves `--distribution` into one `Engine` and checks the
settings against it (`runtime.start`).
`make_distributor` makes that engine's distributor (`runtime.distributor_for`
the one of a `--distribution` value, for benchmarks and tests), and
everything else talks to the `distribute.base.Distributor` interface. An
engine's module is imported only when its distributor is made (`Call`),
so a run without Horovod never imports it.
"""

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


def make_distributor(engine, optim, config, devices=None):
    """Creates the distributor of `engine`, as start-up resolved it.

    Args:
      engine: the `registry.Engine` of `runtime.start` (`Started.engine`),
        whose settings it has checked.
      optim: the `settings.OptimConfig`, whose batch the distributor plans
        over its replicas (`base.Distributor.batch`).
      config: the `settings.DistributionConfig`.
      devices: the device plan's names (`Started.devices`; None: the
        default device).

    Returns:
      A `base.Distributor`: the engine's own, or, for an engine that rides
      on another's all-reduce (`Engine.rides_on`), that one's `averaging`.
    """
    make = engine.make
    if engine.rides_on:
        carrier, _ = engine.rides_on(config)
        make = carrier.averaging
    return _call(engine, make, optim, config, devices)


def serve(engine, config, log_root):
    """Serves if this process is only a server task of `engine`.

    Args:
      engine: the `Engine` start-up resolved (`Started.engine`).
      config: the `settings.DistributionConfig`.
      log_root: the run directory (`--log_root`).

    Returns:
      True after serving; False for a process that trains (or evaluates).
    """
    return bool(engine.serve and _call(engine, engine.serve, config, log_root))

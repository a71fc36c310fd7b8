"""The engines' names as settings, and the checks of the settings against one.

What an engine is lives in its record of the engine wing
(`tf_resnet.engines.registry`, free of TensorFlow and of `distribute/`):
this module offers the registered names as `--distribution`'s choices
and checks the distribution settings against the record of the engine
they name. It imports nothing of the wing's runtime parts, and the wing
nothing of `config`.
"""

from tf_resnet.engines import registry
from tf_resnet.errors import UserInputError

# `--gradient_compression`: Horovod's names (`hvd.Compression.fp16`).
NO_COMPRESSION = "none"
GRADIENT_COMPRESSIONS = (NO_COMPRESSION, "fp16")


def distributions():
    """`--distribution`'s choices: `auto`, then every registered engine.

    A function, asked when the flags are defined, so an engine registered
    by a module imported before then is a choice too.
    """
    return (registry.AUTO, *registry.ENGINES)


def check_settings(engine, dist):
    """Whether the distribution settings `dist` suit `engine`.

    The knobs of a gradient all-reduce (the engine's `compresses`,
    `packs` and `overlaps`), then the engine's own `check`.

    Raises:
      UserInputError: a knob the engine does not take, naming the engines
        that do; or the engine's own refusal.
    """
    knobs = (
        ("gradient_compression", NO_COMPRESSION, "compresses"),
        ("all_reduce_pack_bytes", 0, "packs"),
        ("overlap_all_reduce", True, "overlaps"),
    )
    for flag, unset, fact in knobs:
        value = getattr(dist, flag)
        if value != unset and not getattr(engine, fact):
            takers = [
                e.name for e in registry.ENGINES.values() if getattr(e, fact)
            ]
            raise UserInputError(
                f"--{flag}={value} is for a gradient all-reduce; "
                f"--distribution={engine.name} has none that takes it "
                f"(engines that do: {', '.join(takers)})"
            )
    if engine.check:
        engine.check(dist)

"""The options of every model builder, in one type.

Each option (`--shortcut`, `--stem`, ...) is a field of `ModelOptions`, read
by the builder (`resnet.resnet`) or the blocks (`blocks`); no family repeats
them in its own signature. A `Family` says which options its models take and
its own defaults. So a new option is a field here plus the code that reads
it, and a family whose architecture has no use for an option refuses it with
one clear error instead of ignoring it.
"""

import dataclasses

from tf_resnet.errors import UserInputError

SHORTCUTS = ("zero_pad", "projection")
STEMS = ("imagenet", "cifar")
# Options every family takes: they change the blocks, not the layout.
COMMON = frozenset(("shortcut", "sync_bn", "zero_init_residual"))


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """What a model is built with, beyond its name and input/output sizes.

    The fields have the names of the flags (and of `build_model`'s keyword
    options) that set them.

    Attributes:
      shortcut: `"zero_pad"` (option A of the paper, no parameters) or
        `"projection"` (option B, 1x1 conv + BN), where the shape changes.
      sync_bn: synchronise batch statistics across replicas.
      zero_init_residual: every block starts as its shortcut (see `blocks`).
      stem: `"imagenet"` (7x7/2 conv and 3x3/2 max pool, for 224x224
        inputs) or `"cifar"` (one 3x3/1 conv, for 32x32 or 64x64 inputs).
      dropout_rate: dropout after the stem, or `None` for no dropout layer
        at all (a family without one).
    """

    shortcut: str = "projection"
    sync_bn: bool = False
    zero_init_residual: bool = False
    stem: str = "cifar"
    dropout_rate: float | None = None

    def __post_init__(self):
        # Checked here, not where a layer reads the value, so a bad value
        # fails before any layer exists, whichever family reads it.
        if self.shortcut not in SHORTCUTS:
            raise UserInputError(
                f"--shortcut must be one of {', '.join(SHORTCUTS)}, "
                f"got {self.shortcut!r}"
            )
        if self.stem not in STEMS:
            raise UserInputError(
                f"--stem must be one of {', '.join(STEMS)}, got {self.stem!r}"
            )
        if self.dropout_rate is not None and not 0 <= self.dropout_rate < 1:
            raise UserInputError(
                f"--dropout_rate must be in [0, 1), got {self.dropout_rate}"
            )

    def block_options(self):
        """The keyword options of every residual block (`blocks.stages`)."""
        return {
            "shortcut": self.shortcut,
            "sync_bn": self.sync_bn,
            "zero_init_residual": self.zero_init_residual,
        }


@dataclasses.dataclass(frozen=True)
class Family:
    """Models sharing a layout: the options they take and their defaults.

    Attributes:
      label: the family's models, as error messages name them.
      defaults: the options of a model built without any.
      takes: the names of the options a caller may set.
    """

    label: str
    defaults: ModelOptions
    takes: frozenset = COMMON

    def resolve(self, model, given):
        """The options of `model`: the family's defaults updated by `given`.

        Args:
          model: the model's name, for error messages.
          given: `{option name: value}` set by the caller.

        Returns:
          A `ModelOptions`.

        Raises:
          UserInputError: an option the family does not take, or a bad
            value.
        """
        for key in sorted(given):
            if key not in self.takes:
                known = ", ".join(f"--{name}" for name in sorted(self.takes))
                raise UserInputError(
                    f"--{key} is not an option of {model} ({self.label} "
                    f"take {known})"
                )
        return dataclasses.replace(self.defaults, **given)

"""How a setting is defined once: a dataclass field that carries its flag.

Every setting of a run is a field of a group in `settings`, declared with
`setting(default, help, choices=..., bounds=...)`. The field's default, help
text, choices and bounds are all there is: `flags` generates the absl flag
of the same name from them, and `check` validates a filled group against
them, so the command line and the checks cannot disagree with the config.

Imports no TensorFlow (`settings` is read by launchers and tools).
"""

import dataclasses
import math
import types
import typing

from tf_resnet.errors import UserInputError


@dataclasses.dataclass(frozen=True)
class Range:
    """An interval a number must lie in; an open end excludes its bound."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value):
        if self.low is not None and (
            value < self.low or (self.low_open and value == self.low)
        ):
            return False
        return self.high is None or not (
            value > self.high or (self.high_open and value == self.high)
        )

    def __str__(self):
        if self.high is None:
            if self.low == 0:
                return "positive" if self.low_open else "non-negative"
            return f"{'above' if self.low_open else 'at least'} {self.low:g}"
        left, right = (
            "(" if self.low_open else "[",
            ")" if self.high_open else "]",
        )
        return f"in {left}{self.low:g}, {self.high:g}{right}"


NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
AT_LEAST_ONE = Range(1)
FRACTION = Range(0, 1)  # [0, 1]
BELOW_ONE = Range(0, 1, high_open=True)  # [0, 1)
_NONE = type(None)


def setting(default, help, *, choices=None, bounds=None):
    """A config field and everything its flag needs.

    Args:
      default: the value when nothing sets it (also the flag's default).
      help: the flag's help text.
      choices: the allowed values, or a function returning them when asked
        (the models, which a script may register after this is imported);
        those are checked by the flag parser and by the code that uses them.
      bounds: a `Range` a number must lie in.

    Returns:
      A `dataclasses.field`.
    """
    metadata = {"help": help, "choices": choices, "bounds": bounds}
    return dataclasses.field(default=default, metadata=metadata)


def base_type(field):
    """`str` of a `str | None` field; the annotation itself otherwise."""
    if isinstance(field.type, types.UnionType):
        (kind,) = [t for t in typing.get_args(field.type) if t is not _NONE]
        return kind
    return field.type


def choices(field):
    """The field's allowed values, or None; a function's are asked for."""
    allowed = field.metadata.get("choices")
    return tuple(allowed()) if callable(allowed) else allowed


def check(group):
    """Checks one filled group against its fields' schema.

    Every float must be finite, every value with static choices one of
    them, every bounded number inside its bounds.

    Raises:
      UserInputError: naming the flag, its value and what it must be.
    """
    for field in dataclasses.fields(group):
        name, value = field.name, getattr(group, field.name)
        numbers = value if isinstance(value, tuple) else (value,)
        for number in numbers:
            if isinstance(number, float) and not math.isfinite(number):
                raise UserInputError(
                    f"--{name}={value}: must be a finite number"
                )
        allowed = field.metadata.get("choices")
        static = allowed and not callable(allowed)
        if static and value is not None and value not in allowed:
            raise UserInputError(
                f"unknown --{name}={value}; known: {', '.join(allowed)}"
            )
        bounds = field.metadata.get("bounds")
        if bounds is not None and value is not None and value not in bounds:
            raise UserInputError(f"--{name} must be {bounds}, got {value}")

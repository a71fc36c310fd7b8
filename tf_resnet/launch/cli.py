"""The command line every launcher shares.

  python -m tf_resnet.launch.<launcher> <its flags> -- <flags for --main>

The launcher's own flags come before `--`, those of the training script
(`--main`, by default this checkout's `resnet_main.py`) after it, so the
two sets never clash (`--np` after `--` is the script's). Flag errors are
one line, marked as the launcher's, exit code 2.

A launcher that reads a flag of the script (`given_flag`) reads it as the
script's absl does, so it reads what the script will run with.
"""

import argparse
import os
import sys

from absl import flags

from tf_resnet.config import flags as resnet_flags
from tf_resnet.config import settings
from tf_resnet.engines import registry

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def logger(name):
    """A function printing one line to stderr, marked as `name`'s."""

    def log(message):
        print(f"{name}: {message}", file=sys.stderr, flush=True)

    return log


class Parser(argparse.ArgumentParser):
    """Reports a flag error in one line through `log`, exit code 2.

    Adds `--main`: every launcher runs a training script.
    """

    def __init__(self, log, **kwargs):
        super().__init__(**kwargs)
        self.log = log
        self.add_argument(
            "--main",
            default=os.path.join(ROOT, "resnet_main.py"),
            help="The training script (default: resnet_main.py of this "
            "checkout).",
        )

    def error(self, message):
        self.log(f"error: {message} (see --help)")
        sys.exit(2)

    def parse_launcher_args(self, argv, dashes_required=False):
        """Parses the flags before `--`; `main_flags` holds those after.

        Args:
          argv: the launcher's arguments (`sys.argv[1:]`).
          dashes_required: without `--`, exit with an error instead of
            passing no flags to `--main`.

        Returns:
          The parsed flags, with `main_flags` (a list) added.
        """
        if "--" in argv:
            split = argv.index("--")
            own, main_flags = argv[:split], argv[split + 1 :]
        else:
            own, main_flags = argv, None
        args, unknown = self.parse_known_args(own)
        if main_flags is None and dashes_required:
            self.error("no --: put the flags for --main after --")
        if unknown:
            self.error(f"unrecognized arguments before --: {' '.join(unknown)}")
        if not os.path.isfile(args.main):
            self.error(f"--main={args.main} is not a file")
        args.main_flags = main_flags or []
        try:  # Once here, so that `given_flag` can raise no more.
            _read_flags(args.main_flags)
        except (flags.Error, ValueError) as error:
            self.error(f"in the flags after --: {' '.join(str(error).split())}")
        return args

    def check_engine(self, args, runs, what):
        """Exits with an error if `--main`'s flags name an engine not in `runs`.

        The launcher's processes can run no other, and the flag it adds
        would silently override the one given (absl keeps the last).

        Args:
          args: the parsed flags (`parse_launcher_args`).
          runs: the names of the engines the launcher's processes run.
          what: the error's words before the engines, e.g. "these
            workers run".
        """
        distribution = given_flag(args.main_flags, "distribution")
        if distribution not in (None, registry.AUTO, *runs):
            self.error(
                f"--distribution={distribution}: {what} " + " or ".join(runs)
            )


# The flags of `--main` that a launcher reads.
READ_FLAGS = ("distribution", "log_root", "peer_timeout_secs")


def _read_flags(main_flags):
    """The `FlagValues` of `READ_FLAGS` after parsing `main_flags`.

    The script's own definitions of them (`config.flags.define`), parsed
    by absl known-only: every spelling absl takes counts (`--name=X`,
    `-name=X`, `--name X`, a `--flagfile` that holds it), and the last one
    given wins, as in the script. The script's other flags are left to it:
    their values are its to check (a `--model` the script registers is
    unknown here).

    Raises:
      flags.Error, ValueError: a bad value of a read flag (outside its
        setting's bounds too: a launcher uses it), a flagfile that cannot
        be read.
    """
    values = flags.FlagValues()
    read = [f for f in settings.fields() if f.name in READ_FLAGS]
    for field in read:
        resnet_flags.define(field, values)
    values(["main", *main_flags], known_only=True)
    for field in read:
        bounds, value = field.metadata["bounds"], values[field.name].value
        if bounds is not None and value not in bounds:
            raise ValueError(f"--{field.name} must be {bounds}, got {value}")
    return values


def given_flag(main_flags, name):
    """The value of `--name` (one of `READ_FLAGS`) for `--main`, or None.

    None when the flags do not give it; read as the script reads it
    (`_read_flags`), from flags that `Parser.parse_launcher_args` checked.
    """
    flag = _read_flags(main_flags)[name]
    return flag.value if flag.present else None


def flag_value(main_flags, name):
    """The value `--main` runs with for `--name` (one of `READ_FLAGS`).

    The given one, or else the script's default, read as `given_flag`.
    """
    return _read_flags(main_flags)[name].value

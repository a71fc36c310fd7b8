"""The command line every launcher shares.

  python -m tf_resnet.launch.<launcher> <its flags> -- <flags for --main>

The launcher's own flags come before `--`, those of the training script
(`--main`, by default this checkout's `resnet_main.py`) after it, so the
two sets never clash (`--np` after `--` is the script's). Flag errors are
one line, marked as the launcher's, exit code 2.
"""

import argparse
import os
import sys

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
        return args


def given_flag(main_flags, name):
    """`--name` among the training script's flags (the last one), or None.

    Both spellings absl accepts, `--name=X` and `--name X`.
    """
    value = None
    for index, flag in enumerate(main_flags):
        if flag.startswith(f"--{name}="):
            value = flag.partition("=")[2]
        elif flag == f"--{name}" and index + 1 < len(main_flags):
            value = main_flags[index + 1]
    return value

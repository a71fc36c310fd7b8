"""Runs Horovod ranks on this machine with nothing reachable from outside.

  python -m tf_resnet.distribute.horovod_launcher --np=2 -- \
      --distribution=horovod \
      --train_data_path='cifar-10-batches-bin/data_batch*' \
      --eval_data_path=cifar-10-batches-bin/test_batch.bin \
      --log_root=/tmp/resnet_hvd

Everything after `--` goes unchanged to every rank's `resnet_main.py`
(`--main`): pass `--distribution=horovod` (or `averaging`) yourself, the
launcher adds no flag. It runs

  horovodrun -np N -H localhost:N --gloo --network-interface lo \
      python resnet_main.py <flags>

`horovodrun` (Horovod 0.28.1) starts its rendezvous HTTP server on
`0.0.0.0` for the whole run, even with `-H localhost:N`, and the Gloo
ranks accept connections the same way. So by default the launcher first
moves itself into a new network namespace whose only device is the
loopback (`private_network.py`, as `ps_launcher` does), then replaces
itself with `horovodrun` (`exec`: signals and the exit code are
`horovodrun`'s own), whose ranks inherit the namespace. This needs root or
unprivileged user namespaces (Linux); `--network=host` skips it.

For several machines run `horovodrun` (or the scripts in `scripts/`)
directly: the network between the hosts is then yours to configure.

Only the standard library is imported: like `ps_launcher`, the launcher
re-executes itself as a plain script to start single-threaded, which
`unshare(CLONE_NEWUSER)` requires, and without loading TensorFlow.
"""

import argparse
import os
import shutil
import sys

if __package__:
    from tf_resnet.distribute import private_network
else:  # The plain `python -I` script (see main): import the sibling module.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import private_network

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
LISTENERS = "horovodrun's rendezvous server and the Gloo ranks"


def log(message):
    """Prints one line to stderr, marked as the launcher's."""
    print(f"horovod_launcher: {message}", file=sys.stderr, flush=True)


def horovodrun_command(num_ranks, command, horovodrun="horovodrun"):
    """`horovodrun` running `command` as `num_ranks` ranks on this machine.

    Gloo (the project's Horovod is built without MPI) over the loopback.
    The one place that builds this command line: tests and benchmarks
    launch through this module.
    """
    return [
        horovodrun,
        "-np",
        str(num_ranks),
        "-H",
        f"localhost:{num_ranks}",
        "--gloo",
        "--network-interface",
        "lo",
        *command,
    ]


def find_horovodrun():
    """The `horovodrun` of this Python's environment, else of PATH, or None."""
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("horovodrun")


class _Parser(argparse.ArgumentParser):
    """Reports a flag error in one line, exit code 2."""

    def error(self, message):
        log(f"error: {message} (see --help)")
        sys.exit(2)


def parse_args(argv):
    """The launcher's own flags; those after `--` go to `--main`."""
    parser = _Parser(
        prog="python -m tf_resnet.distribute.horovod_launcher",
        description="Runs --np Horovod ranks of --main on this machine with "
        "horovodrun, in a loopback-only network namespace. Flags after -- go "
        "unchanged to every rank: pass --distribution=horovod (or averaging) "
        "there yourself.",
    )
    parser.add_argument(
        "--np", type=int, required=True, help="Number of ranks to start."
    )
    private_network.add_network_flag(parser, LISTENERS)
    parser.add_argument(
        "--main",
        default=os.path.join(ROOT, "resnet_main.py"),
        help="The training script (default: resnet_main.py of this checkout).",
    )
    if "--" not in argv:
        own, main_flags = argv, None
    else:
        split = argv.index("--")
        own, main_flags = argv[:split], argv[split + 1 :]
    args, unknown = parser.parse_known_args(own)
    if main_flags is None:
        parser.error("no --: put the flags for --main after --")
    if unknown:
        parser.error(f"unrecognized arguments before --: {' '.join(unknown)}")
    if args.np < 1:
        parser.error("--np must be at least 1")
    if not os.path.isfile(args.main):
        parser.error(f"--main={args.main} is not a file")
    args.main_flags = main_flags
    return args


def main(argv=None):
    """Enters the private network, then becomes `horovodrun`.

    Returns:
      An exit code, only when `horovodrun` could not be started.
    """
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    horovodrun = find_horovodrun()
    if horovodrun is None:
        log(
            f"error: no horovodrun next to {sys.executable} or on PATH; "
            "install Horovod (setup.sh) or activate its environment"
        )
        return 2
    if args.network == "private":
        private_network.restart_single_threaded(__file__, argv)
    failed = private_network.apply_network_flag(args.network, LISTENERS, log)
    if failed:
        return failed
    command = horovodrun_command(
        args.np, [sys.executable, args.main, *args.main_flags], horovodrun
    )
    os.execv(horovodrun, command)


if __name__ == "__main__":
    sys.exit(main())

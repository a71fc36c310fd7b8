"""Runs Horovod ranks on this machine with nothing reachable from outside.

  python -m tf_resnet.launch.horovod --np=2 -- \
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
loopback (`private_network`), then replaces itself with `horovodrun`,
whose ranks inherit the namespace. This needs root or unprivileged user
namespaces (Linux); `--network=host` skips it.

Why `exec horovodrun` and not `processes.run_peers` as the other
launchers: `horovodrun` has to run anyway, as the rendezvous server the
ranks find each other through and as the one that gives each rank its
`HOROVOD_*` environment; and it already does what `run_peers` would: it
ends every rank when one fails (non-elastic Gloo runs), on SIGINT/SIGTERM,
and when it is itself killed (its per-rank middleman watches it). Run
under `run_peers` it would be the only process, supervised twice. With
`exec` the signals and the exit code are `horovodrun`'s own (1 when a rank
failed: it names the rank and its code).

For several machines run `horovodrun` (or the scripts in `scripts/`)
directly: the network between the hosts is then yours to configure.
"""

import os
import shutil
import sys

from tf_resnet import native_log
from tf_resnet.launch import cli, private_network

LISTENERS = "horovodrun's rendezvous server and the Gloo ranks"
log = cli.logger("launch.horovod")


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


def parse_args(argv):
    """The launcher's own flags; those after `--` go to `--main`."""
    parser = cli.Parser(
        log,
        prog="python -m tf_resnet.launch.horovod",
        description="Runs --np Horovod ranks of --main on this machine with "
        "horovodrun, in a loopback-only network namespace. Flags after -- go "
        "unchanged to every rank: pass --distribution=horovod (or averaging) "
        "there yourself.",
    )
    parser.add_argument(
        "--np", type=int, required=True, help="Number of ranks to start."
    )
    private_network.add_network_flag(parser, LISTENERS)
    args = parser.parse_launcher_args(argv, dashes_required=True)
    if args.np < 1:
        parser.error("--np must be at least 1")
    return args


def main(argv=None):
    """Enters the private network, then becomes `horovodrun`.

    Returns:
      An exit code, only when `horovodrun` could not be started.
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    horovodrun = find_horovodrun()
    if horovodrun is None:
        log(
            f"error: no horovodrun next to {sys.executable} or on PATH; "
            "install Horovod (setup.sh) or activate its environment"
        )
        return 2
    failed = private_network.apply_network_flag(args.network, LISTENERS, log)
    if failed:
        return failed
    command = horovodrun_command(
        args.np, [sys.executable, args.main, *args.main_flags], horovodrun
    )
    # horovodrun imports TensorFlow itself, whose INFO lines (oneDNN, CPU
    # features) a single run keeps out: the ranks' level, set for it too.
    native_log.default_level()
    os.execv(horovodrun, command)


if __name__ == "__main__":
    sys.exit(main())

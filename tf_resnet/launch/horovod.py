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
loopback (`private_network`), then runs `horovodrun`, whose ranks inherit
the namespace. This needs root or unprivileged user namespaces (Linux);
`--network=host` skips it.

Why `horovodrun` itself and not `processes.run_peers` as the other
launchers: `horovodrun` has to run anyway, as the rendezvous server the
ranks find each other through and as the one that gives each rank its
`HOROVOD_*` environment; and it already does what `run_peers` would: it
ends every rank when one fails (non-elastic Gloo runs), on SIGINT/SIGTERM,
and when it is itself killed (its per-rank middleman watches it).

What the launcher adds is the job's last line. When a rank fails,
`horovodrun` ends the others and prints a traceback of its own after the
ranks' lines ("RuntimeError: Horovod detected that one or more processes
exited with non-zero status ..."), and exits 1 whatever the rank's code
was. So the launcher passes `horovodrun`'s stderr on as it comes, and once
`horovodrun` has exited it says the failed rank's own last line
(`resnet_main: ...`) again, as the last line of the job, with that rank's
exit code: a rank that lost its peers (the lost-peer line of
`tf_resnet.peer_watch`, any rank's) makes it 4, as a single process's;
a rank killed before it could say anything (SIGKILL, the OOM killer)
makes the launcher say the lost-peer line itself, for the peers it left.
SIGTERM and SIGHUP to the launcher are passed on to `horovodrun`; Ctrl-C
in a terminal reaches it directly (it runs in the launcher's process
group; the launcher ignores SIGINT, to say the last line after it), and
it dies with the launcher (`PR_SET_PDEATHSIG`).

For several machines run `horovodrun` (or the scripts in `scripts/`)
directly: the network between the hosts is then yours to configure.
"""

import os
import re
import shutil
import signal
import subprocess
import sys

from tf_resnet import native_log, peer_watch
from tf_resnet.launch import cli, private_network, processes

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
    """Enters the private network, then runs `horovodrun`.

    Returns:
      `horovodrun`'s exit code, or its failed rank's (`run_horovodrun`).
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
    log_root = cli.given_flag(args.main_flags, "log_root") or "."
    return run_horovodrun(command, log_root)


# A rank's line as horovodrun passes it on; the ranks' own last words
# start with "resnet_main: " (an error, a stop, a lost peer).
_RANK_LINE = re.compile(r"\[(\d+)\]<stderr>:(resnet_main: .*)")
# horovodrun's traceback names the first rank that failed.
_FIRST_FAILED = re.compile(r"^Process name: (\d+)\nExit code: (\d+)$", re.M)


def run_horovodrun(command, log_root):
    """Runs `command` (horovodrun); the failed rank's last line comes last.

    Args:
      command: `horovodrun`'s command line.
      log_root: the run's `--log_root`, where a lost-peer line finds the
        newest checkpoint.

    Returns:
      0, or the exit code of the failed rank (4 for a lost peer; 128 + N
      for a rank stopped by signal N), or horovodrun's own where no rank
      failed.
    """
    horovodrun = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        preexec_fn=processes.die_with(os.getpid()),
    )
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: horovodrun.send_signal(signum))
    # Ctrl-C reaches horovodrun from the terminal, in this process group:
    # the launcher lives on to pass its lines on and say the last one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    said = {}  # rank -> its last "resnet_main: " line.
    own = []  # horovodrun's lines: its traceback at the end.
    for raw in horovodrun.stderr:
        sys.stderr.buffer.write(raw)
        sys.stderr.buffer.flush()
        line = raw.decode(errors="replace").rstrip("\r\n")
        found = _RANK_LINE.fullmatch(line)
        if found:
            said[int(found[1])] = found[2]
        elif not line.startswith("["):
            own = [*own[-49:], line]
    code = processes.exit_code(horovodrun.wait())
    if code == 0:
        return 0
    last, code = last_words(said, "\n".join(own), code, log_root)
    if last:
        print(last, file=sys.stderr, flush=True)
    return code


def last_words(said, horovodrun_said, code, log_root):
    """The job's last line and exit code, after `horovodrun` failed.

    Args:
      said: `{rank: its last "resnet_main: " line}`.
      horovodrun_said: horovodrun's own last lines (its traceback).
      code: horovodrun's exit code.
      log_root: the run directory.

    Returns:
      `(line or None, exit code)`: a lost-peer line (the lowest rank's)
      and 4; else the first failed rank's line and code; a rank killed by
      a signal without a word: the lost-peer line for the peers it left,
      and 4.
    """
    lost = sorted(
        rank
        for rank, line in said.items()
        if line.startswith(peer_watch.LOST_PEER_LINE_START)
    )
    if lost:
        return said[lost[0]], peer_watch.LOST_PEER
    failed = _FIRST_FAILED.search(horovodrun_said)
    if not failed:
        return None, code
    rank, rank_code = int(failed[1]), int(failed[2])
    if rank in said:
        return said[rank], rank_code
    if rank_code > 128:
        how = f"rank {rank} ended with {processes.describe_exit(rank_code)}"
        return (
            peer_watch.lost_peer_line(None, f"rank {rank}", log_root, how),
            peer_watch.LOST_PEER,
        )
    return None, rank_code


if __name__ == "__main__":
    sys.exit(main())

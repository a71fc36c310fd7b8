"""Runs Horovod ranks with `horovodrun` or `mpirun`; says the last line.

  python -m tf_resnet.launch.horovod --np=2 -- \
      --distribution=horovod \
      --train_data_path='cifar-10-batches-bin/data_batch*' \
      --eval_data_path=cifar-10-batches-bin/test_batch.bin \
      --log_root=/tmp/resnet_hvd

  python -m tf_resnet.launch.horovod --np=8 --hosts=host1:4,host2:4 \
      --network=host --launcher=mpirun -- --distribution=horovod ...

Everything after `--` goes unchanged to every rank's `resnet_main.py`
(`--main`): pass `--distribution=horovod` (or `averaging`) yourself, the
launcher adds no flag. On this machine it runs

  horovodrun -np N -H localhost:N --gloo --network-interface lo \
      python resnet_main.py <flags>

`horovodrun` (Horovod 0.28.1) starts its rendezvous HTTP server on
`0.0.0.0` for the whole run, even with `-H localhost:N`, and the Gloo
ranks accept connections the same way. So by default the launcher first
moves itself into a new network namespace whose only device is the
loopback (`private_network`), then runs `horovodrun`, whose ranks inherit
the namespace. This needs root or unprivileged user namespaces (Linux);
`--network=host` skips it, and `--hosts` (ranks on other machines, which
a private namespace cannot reach) needs it.

Why `horovodrun` itself and not `processes.run_peers` as the other
launchers: `horovodrun` has to run anyway, as the rendezvous server the
ranks find each other through and as the one that gives each rank its
`HOROVOD_*` environment; and it already does what `run_peers` would: it
ends every rank when one fails (non-elastic Gloo runs), on SIGINT/SIGTERM,
and when it is itself killed (its per-rank middleman watches it). Open
MPI's `mpirun` (`--launcher=mpirun`, for a Horovod built with MPI) does
the same for its ranks.

What the launcher adds is the job's last line. When a rank fails, either
launcher ends the others and prints lines of its own after the ranks'
(`horovodrun` a traceback, "RuntimeError: Horovod detected that one or
more processes exited with non-zero status ...", and exit 1 whatever the
rank's code was; `mpirun` a banner). So the launcher passes their stderr
on as it comes, and once they have exited it says the failed rank's own
last line (`resnet_main: ...`) again, as the last line of the job, with
that rank's exit code: a rank that lost its peers (the lost-peer line of
`tf_resnet.peer_watch`, any rank's) makes it 4, as a single process's; a
rank killed before it could say anything (SIGKILL, the OOM killer), or a
node `mpirun` lost, makes the launcher say the lost-peer line itself, for
the peers it left.

A node cut off from `mpirun` is one it cannot end: after a rank's bound
ends the job, `mpirun` waits for the cut-off node's daemon to acknowledge
the abort, which cannot arrive, until TCP gives up resending it (minutes
to a quarter of an hour). What ends that wait is Open MPI's keepalive on
its connections to its daemons, which must declare the node lost before
the ranks' bound (`--peer_timeout_secs`) ends them, while `mpirun` has
sent nothing yet (docs/reliability.md, "A bare `mpirun` after a cut
link"). So the launcher sets it from the bound (`keepalive_options`),
unless `OMPI_MCA_oob_tcp_keepalive_*` in the environment sets it already.

SIGTERM and SIGHUP to the launcher are passed on to the ranks' launcher;
Ctrl-C in a terminal reaches it directly (it runs in the launcher's
process group; the launcher ignores SIGINT, to say the last line after
it), and it dies with the launcher (`PR_SET_PDEATHSIG`).
"""

import os
import re
import shutil
import signal
import subprocess
import sys

from tf_resnet import native_log, peer_watch
from tf_resnet.launch import cli, private_network, processes

LISTENERS = "horovodrun's rendezvous server, mpirun's daemons and the ranks"
LAUNCHERS = ("horovodrun", "mpirun")
log = cli.logger("launch.horovod")
# What `mpirun` passes on to its ranks besides OMPI_*: where the Python
# and its libraries are, and the settings of the libraries a rank loads.
FORWARDED = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
FORWARDED_PREFIXES = ("HOROVOD_", "NCCL_", "TF_", "CUDA_", "OMP_")
# Open MPI's keepalive (`keepalive_options`): at most this many probes.
KEEPALIVE_PROBES = 9
# The environment's own keepalive, which the launcher leaves as it is.
KEEPALIVE_SET = "OMPI_MCA_oob_tcp_keepalive"


def horovodrun_command(
    num_ranks, command, horovodrun="horovodrun", hosts=None, interface="lo"
):
    """`horovodrun` running `command` as `num_ranks` ranks with Gloo.

    Gloo, which every Horovod of `setup.sh` has (MPI only where an MPI
    was found). On this machine (`hosts` None) over the loopback; across
    `hosts` (`host:slots,...`) over `interface`, or the one `horovodrun`
    finds when None. The one place that builds this command line: tests
    and benchmarks launch through this module.
    """
    interface_flags = ["--network-interface", interface] if interface else []
    return [
        horovodrun,
        "-np",
        str(num_ranks),
        "-H",
        hosts or f"localhost:{num_ranks}",
        "--gloo",
        *interface_flags,
        *command,
    ]


def keepalive_options(bound_secs):
    """Open MPI's keepalive that declares a silent node lost within the bound.

    A connection idle for `oob_tcp_keepalive_time` gets up to
    `oob_tcp_keepalive_probes` probes `oob_tcp_keepalive_intvl` apart;
    the last answered one may lie up to the idle time before a cut, so a
    node is lost at most `time + intvl * probes` after it: here half the
    bound, so that `mpirun` ends the job before the ranks' bound would
    (then `mpirun` would wait on, see the module's docstring), and a blip
    shorter than the probes passes. Open MPI takes whole seconds.
    """
    interval = max(1, round(bound_secs / 30))
    probes = max(1, min(KEEPALIVE_PROBES, int(0.3 * bound_secs / interval)))
    idle = max(1, int(bound_secs / 2 - interval * probes))
    return [
        "-mca", "oob_tcp_keepalive_time", str(idle),
        "-mca", "oob_tcp_keepalive_intvl", str(interval),
        "-mca", "oob_tcp_keepalive_probes", str(probes),
    ]  # fmt: skip


def mpirun_command(
    num_ranks,
    command,
    hosts,
    interface,
    bound_secs,
    mpirun="mpirun",
    environ=None,
):
    """Open MPI's `mpirun` running `command` as `num_ranks` ranks.

    One rank a slot in `hosts` order, not bound to cores (`-bind-to none`:
    TensorFlow runs threads of its own), each line tagged with its rank
    (`--tag-output`, which `run_ranks` reads), the variables a rank needs
    passed on (`FORWARDED`), the keepalive that bounds a cut-off node
    (`keepalive_options`) unless the environment sets it, and the network
    `interface` for both Open MPI's messages and its control channel.
    """
    environ = os.environ if environ is None else environ
    forwarded = [
        name
        for name in sorted(environ)
        if name in FORWARDED or name.startswith(FORWARDED_PREFIXES)
    ]
    interface_flags = []
    if interface:
        interface_flags = [
            "-mca", "btl_tcp_if_include", interface,
            "-mca", "oob_tcp_if_include", interface,
        ]  # fmt: skip
    keepalive = []
    if not any(name.startswith(KEEPALIVE_SET) for name in environ):
        keepalive = keepalive_options(bound_secs)
    return [
        mpirun,
        "-np",
        str(num_ranks),
        "-H",
        hosts or f"localhost:{num_ranks}",
        "-bind-to",
        "none",
        "-map-by",
        "slot",
        "--tag-output",
        *[flag for name in forwarded for flag in ("-x", name)],
        *interface_flags,
        *keepalive,
        *command,
    ]


def find_launcher(name):
    """`name` (horovodrun, mpirun) beside this Python, else on PATH, or None."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which(name)


def parse_args(argv):
    """The launcher's own flags; those after `--` go to `--main`."""
    parser = cli.Parser(
        log,
        prog="python -m tf_resnet.launch.horovod",
        description="Runs --np Horovod ranks of --main with horovodrun or "
        "mpirun: on this machine in a loopback-only network namespace, or "
        "across --hosts. Flags after -- go unchanged to every rank: pass "
        "--distribution=horovod (or averaging) there yourself.",
    )
    parser.add_argument(
        "--np", type=int, required=True, help="Number of ranks to start."
    )
    parser.add_argument(
        "--hosts",
        help="host:slots,... to run the ranks on (the launcher's -H); needs "
        "--network=host. Default: localhost:NP.",
    )
    parser.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="horovodrun",
        help="horovodrun (Gloo, default) or Open MPI's mpirun (a Horovod "
        "built with MPI; the launcher sets mpirun's keepalive from "
        "--peer_timeout_secs so that a node cut off ends the run).",
    )
    parser.add_argument(
        "--network_interface",
        help="The interface the ranks talk over (horovodrun's "
        "--network-interface; mpirun's btl and oob tcp_if_include). "
        "Default: lo on this machine, the launcher's choice across --hosts.",
    )
    private_network.add_network_flag(parser, LISTENERS)
    args = parser.parse_launcher_args(argv, dashes_required=True)
    if args.np < 1:
        parser.error("--np must be at least 1")
    if args.hosts and args.network == "private":
        parser.error(
            "--hosts runs ranks on other machines, which a private network "
            "namespace cannot reach: pass --network=host"
        )
    return args


def main(argv=None):
    """Enters the private network, then runs `horovodrun` or `mpirun`.

    Returns:
      The ranks' launcher's exit code, or its failed rank's (`run_ranks`).
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    launcher = find_launcher(args.launcher)
    if launcher is None:
        log(
            f"error: no {args.launcher} next to {sys.executable} or on PATH; "
            + (
                "install Horovod (setup.sh) or activate its environment"
                if args.launcher == "horovodrun"
                else "install Open MPI (mpirun) and build Horovod with it "
                "(setup.sh)"
            )
        )
        return 2
    failed = private_network.apply_network_flag(args.network, LISTENERS, log)
    if failed:
        return failed
    command = [sys.executable, args.main, *args.main_flags]
    interface = args.network_interface or (None if args.hosts else "lo")
    if args.launcher == "mpirun":
        bound = cli.flag_value(args.main_flags, "peer_timeout_secs")
        command = mpirun_command(
            args.np, command, args.hosts, interface, bound, launcher
        )
    else:
        command = horovodrun_command(
            args.np, command, launcher, args.hosts, interface
        )
    # horovodrun imports TensorFlow itself, whose INFO lines (oneDNN, CPU
    # features) a single run keeps out: the ranks' level, set for it too.
    native_log.default_level()
    log_root = cli.given_flag(args.main_flags, "log_root") or "."
    return run_ranks(command, log_root)


# A rank's line as horovodrun (`[rank]`) or mpirun --tag-output
# (`[job,rank]`) passes it on; the ranks' own last words start with
# "resnet_main: " (an error, a stop, a lost peer).
_TAG = r"\[(?:\d+,)?(\d+)\]<stderr>:"
_RANK_LINE = re.compile(_TAG + r"(resnet_main: .*)")
# A rank's progress: the last step it logged.
_STEP = re.compile(_TAG + r".*\] step (\d+)/")
# Both launchers name the first rank that failed: "Process name: 1" and
# "Exit code: 4" (horovodrun), "Process name: [[1234,1],1]" (mpirun).
_FIRST_FAILED = re.compile(
    r"^\s*Process name:\s+(?:\[\[\d+,\d+\],)?(\d+)\]?\s*\n"
    r"\s*Exit code:\s+(\d+)\s*$",
    re.M,
)
# mpirun: a rank killed by a signal; a node whose daemon it lost.
_SIGNALED = re.compile(
    r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)"
)
_LOST_NODE = re.compile(
    r"ORTE has lost communication with a remote daemon\.[\s\S]*?"
    r"Remote daemon: \S+ on node (\S+)"
)


def run_ranks(command, log_root):
    """Runs `command` (horovodrun, mpirun); the failed rank's line comes last.

    Args:
      command: the ranks' launcher's command line.
      log_root: the run's `--log_root`, where a lost-peer line finds the
        newest checkpoint.

    Returns:
      0, or the exit code of the failed rank (4 for a lost peer or node;
      128 + N for a rank stopped by signal N), or the launcher's own
      where no rank failed.
    """
    launcher = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        preexec_fn=processes.die_with(os.getpid()),
    )
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: launcher.send_signal(signum))
    # Ctrl-C reaches the launcher from the terminal, in this process group:
    # this one lives on to pass its lines on and say the last one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    said = {}  # rank -> its last "resnet_main: " line.
    step = None  # The last step a rank logged.
    own = []  # The launcher's lines: its traceback or banner at the end.
    for raw in launcher.stderr:
        sys.stderr.buffer.write(raw)
        sys.stderr.buffer.flush()
        line = raw.decode(errors="replace").rstrip("\r\n")
        found = _RANK_LINE.fullmatch(line)
        if found:
            said[int(found[1])] = found[2]
        elif progress := _STEP.match(line):
            step = int(progress[2])
        elif not line.startswith("["):
            own = [*own[-49:], line]
    code = processes.exit_code(launcher.wait())
    if code == 0:
        return 0
    last, code = last_words(said, "\n".join(own), code, log_root, step)
    if last:
        print(last, file=sys.stderr, flush=True)
    return code


def last_words(said, launcher_said, code, log_root, step=None):
    """The job's last line and exit code, after the ranks' launcher failed.

    Args:
      said: `{rank: its last "resnet_main: " line}`.
      launcher_said: the launcher's own last lines (traceback, banner).
      code: the launcher's exit code.
      log_root: the run directory.
      step: the last step a rank logged, for a line the launcher says.

    Returns:
      `(line or None, exit code)`: a lost-peer line (the lowest rank's)
      and 4; else the first failed rank's line and code; a rank killed by
      a signal without a word, or a node `mpirun` lost: the lost-peer line
      for the peers left, and 4.
    """
    lost = sorted(
        rank
        for rank, line in said.items()
        if line.startswith(peer_watch.LOST_PEER_LINE_START)
    )
    if lost:
        return said[lost[0]], peer_watch.LOST_PEER
    node = _LOST_NODE.search(launcher_said)
    if node:
        how = f"mpirun lost its daemon on {node[1]}: cut off or down"
        return _lost(step, f"the ranks on {node[1]}", log_root, how)
    failed = _FIRST_FAILED.search(launcher_said)
    signaled = _SIGNALED.search(launcher_said)
    if failed:
        rank, rank_code, where = int(failed[1]), int(failed[2]), ""
    elif signaled:
        rank, rank_code = int(signaled[1]), 128 + int(signaled[3])
        where = f" on {signaled[2]}"
    elif code > 128:  # mpirun ends with a killed rank's code, unnamed.
        how = f"a rank ended with {processes.describe_exit(code)}"
        return _lost(step, "the ranks", log_root, how)
    else:
        return None, code
    if rank in said:
        return said[rank], rank_code
    if rank_code > 128:
        how = f"rank {rank} ended with {processes.describe_exit(rank_code)}"
        return _lost(step, f"rank {rank}{where}", log_root, how)
    return None, rank_code


def _lost(step, peers, log_root, how):
    line = peer_watch.lost_peer_line(step, peers, log_root, how)
    return line, peer_watch.LOST_PEER


if __name__ == "__main__":
    sys.exit(main())

"""The processes of one local job: started, watched and stopped together.

Every launcher runs all processes of a job on this machine, after it has
entered the job's network namespace (`private_network`); the processes
inherit it. What the launchers share:

* `ProcessGroup`: the processes form one process group of their own, so
  Ctrl-C in the terminal reaches only the launcher, which decides how to
  stop them; each gets SIGKILL when the launcher dies, even of SIGKILL
  (`PR_SET_PDEATHSIG`), so none outlives it holding a port open; `stop`
  ends them all.
* `StopSignals`: SIGINT, SIGTERM and SIGHUP are recorded instead of
  ending the launcher, which first asks its processes to stop (training
  checkpoints on SIGTERM) and kills them only after a time limit or a
  second signal.
* `run_peers`: the whole life of a job of equal processes, such as the
  workers of a multi-worker all-reduce: the first one to fail ends the
  job, and its exit code is the launcher's. The parameter-server launcher
  (`ps`) has its own rules (dead workers are restarted, the coordinator
  stops first) on top of the same group.
"""

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time

PR_SET_PDEATHSIG = 1
POLL_SECS = 0.2


def exit_code(returncode):
    """A child's exit code as a shell reports it: 128 + N for signal N."""
    return 128 - returncode if returncode < 0 else returncode


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def die_with(launcher_pid):
    """A `preexec_fn` making the child get SIGKILL when `launcher_pid` dies.

    Runs in the child before exec; a child whose launcher died before it
    could ask exits at once.
    """

    def set_death_signal():
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != launcher_pid:  # The launcher died before prctl.
            os._exit(1)

    return set_death_signal


class StopSignals:
    """Records SIGINT/SIGTERM/SIGHUP (by name) for a supervision loop."""

    def __init__(self):
        self.received = []
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        del frame
        self.received.append(signal.Signals(signum).name)

    def to_forward(self):
        """What to send the job: SIGINT for SIGINT, else SIGTERM."""
        if self.received[0] == "SIGINT":
            return signal.SIGINT
        return signal.SIGTERM


class ProcessGroup:
    """The processes of one job; `stop` ends every one of them."""

    def __init__(self, log):
        self.log = log
        self.processes = {}  # name -> Popen, the latest of that name.
        self.group = 0  # Process group id, set by the first process.

    def start(self, name, command, env=None):
        """Starts `command` as `name` (replacing an exited one of that name).

        Args:
          name: how the log and `exits` call it, e.g. "worker 1".
          command: the argument list.
          env: its environment (default: the launcher's).

        Returns:
          The `subprocess.Popen`.
        """
        if not self.running():  # The old group is gone with its members.
            self.group = 0
        process = subprocess.Popen(
            command,
            env=env,
            process_group=self.group,
            preexec_fn=die_with(os.getpid()),
        )
        self.group = self.group or process.pid
        self.processes[name] = process
        self.log(f"started {name} (pid {process.pid})")
        return process

    def running(self):
        """The names of the processes still running."""
        return [
            name
            for name, process in self.processes.items()
            if process.poll() is None
        ]

    def exits(self):
        """`(name, returncode)` of every process that exited, in start order."""
        return [
            (name, process.returncode)
            for name, process in self.processes.items()
            if process.poll() is not None
        ]

    def send(self, sig):
        """Sends `sig` to every process of the group."""
        if self.group:
            with contextlib.suppress(ProcessLookupError):  # All exited.
                os.killpg(self.group, sig)

    def stop(self, grace_secs=5.0):
        """Terminates the whole group, then kills what remains."""
        if self.running():
            for sig in (signal.SIGTERM, signal.SIGCONT):  # CONT: if stopped.
                self.send(sig)
            deadline = time.monotonic() + grace_secs
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.1)
        self.send(signal.SIGKILL)  # Also what the processes started.
        for process in self.processes.values():
            process.wait()


def describe_exit(returncode):
    """`code 137 (SIGKILL)`: a child's exit code, and the signal behind it."""
    code = exit_code(returncode)
    try:
        return f"code {code} ({signal.Signals(code - 128).name})"
    except ValueError:
        return f"code {code}"


def run_peers(
    commands, log, stop_timeout_secs=120.0, signals=None, advice=None
):
    """Runs a job of equal processes to its end; returns its exit code.

    The job ends when every process has exited 0, or when the first one
    fails: the others are stopped then (SIGTERM, SIGKILL 5 s later). A stop
    signal to the launcher is forwarded to all of them (SIGINT as SIGINT,
    others as SIGTERM); they get `stop_timeout_secs` to exit, a second
    signal or the end of that time kills them.

    Args:
      commands: `{name: (argument list, environment or None)}`.
      log: prints one line as the launcher's.
      stop_timeout_secs: how long the processes may take after a forwarded
        stop signal.
      signals: a `StopSignals` installed earlier; default: a new one.
      advice: `fn(exit code)`: after a failure, what the user can do; the
        launcher's last line then names the failed process, its exit code
        and this.

    Returns:
      0 when all exited 0; else the exit code of the first that did not
      (`exit_code`: 128 + N for signal N).
    """
    signals = signals or StopSignals()
    group = ProcessGroup(log)
    try:
        for name, (command, env) in commands.items():
            group.start(name, command, env)
        failed = _watch_peers(group, signals, stop_timeout_secs, log)
    finally:
        group.stop()
        log("all processes stopped")
    if failed is None:
        return 0
    name, returncode = failed
    if advice:
        what = advice(exit_code(returncode))
        log(f"{name} exited with {describe_exit(returncode)}: {what}")
    return exit_code(returncode)


def _watch_peers(group, signals, stop_timeout_secs, log):
    """`(name, returncode)` of the first process that failed, or None."""
    failed = {}  # name -> returncode, in the order the failures were seen.
    forwarded_at = killed = None
    while True:
        for name, code in group.exits():
            if code != 0:
                failed.setdefault(name, code)
        first = next(iter(failed.items()), None)
        if first and forwarded_at is None:
            log(f"{first[0]} exited with code {first[1]}; stopping the others")
            return first
        if not group.running():
            if first:
                log(f"{first[0]} was the first to exit with code {first[1]}")
            return first
        if signals.received and forwarded_at is None:
            log(f"{signals.received[0]}: asking every process to stop")
            group.send(signals.to_forward())
            forwarded_at = time.monotonic()
        elif (
            forwarded_at is not None
            and not killed
            and (
                len(signals.received) > 1
                or time.monotonic() - forwarded_at > stop_timeout_secs
            )
        ):
            log("killing every process")
            group.send(signal.SIGKILL)
            killed = True
        time.sleep(POLL_SECS)

"""A bound on how long a process of a multi-process run waits for its peers.

A peer that dies resets its connections and the collectives fail at once;
one cut off by the network (a link down, a partition) or frozen sends
nothing at all, and what then ends the wait depends on the engine: Gloo's
timeout (`HOROVOD_GLOO_TIMEOUT_SECONDS`, 30 s by default) under
horovodrun, TensorFlow's coordination service and collective timeout under
`multi_worker`, nothing under Horovod on MPI (`mpirun`, `srun --mpi`): its
ranks wait in the all-reduce until the job is killed (Horovod's stall
inspector watches tensors some ranks submitted and others not, from the
coordinator's negotiation, which is itself a collective with the lost
rank).

`PeerWatch` is the bound every engine gets (`--peer_timeout_secs`): it
ends the process with `LOST_PEER` (the exit code of a lost task, which
the Slurm jobs of scripts/ requeue on) when no progress was marked for
that long. The training loop marks progress at every finished step, and
before and after each evaluation and checkpoint save, so the bound is on
the longest stretch between two marks: a step (the first one compiles),
an evaluation, a save, or the wait for a peer in one of them (a peer's
save, its slower start). Its last words are one line, the same as a
lost-peer error's that the engine raised itself (`lost_peer_line`): the
step, the peers, the newest complete checkpoint on disk and that the same
command resumes.

The end comes from the C library, not from Python (`_ExitTimers`): the
thread that waits on the peers is in a collective that neither Python nor
TensorFlow can interrupt, and may hold the GIL while it waits.

A process that only serves (a parameter-server cluster's ps and worker
tasks) has no steps: what shows its coordinator is there is traffic on
its TCP connections, which training keeps busy (each step is a function
the coordinator runs on a worker, reading and updating the variables on
the ps). `watch_traffic` marks progress whenever one of them received
data, so a server whose coordinator is gone, cut off or frozen for the
bound ends the same way, instead of serving until killed.
"""

import ctypes
import os
import re
import socket
import struct
import threading
import time

# resnet_main.py's exit code of a lost peer (a task of the cluster gone or
# silent): the Slurm jobs of scripts/ requeue on it
# (tf_resnet/jobs/status.py).
LOST_PEER = 4
# How that line begins: launchers that pass ranks' lines on find it by it.
LOST_PEER_LINE_START = "resnet_main: error: lost a task of the training cluster"


def newest_checkpoint(log_root):
    """The newest complete checkpoint in `log_root`, from its index, or None.

    TensorFlow writes the `checkpoint` index only after the checkpoint's
    files, so what it names is complete. Read as text, without TensorFlow:
    the watch's thread must not wait on a lock the stuck one holds.
    """
    try:
        with open(os.path.join(log_root, "checkpoint")) as stream:
            text = stream.read()
    except OSError:
        return None
    found = re.search(r'^model_checkpoint_path: "(.*)"$', text, re.M)
    if not (found and found[1]):
        return None
    path = found[1]
    return path if os.path.isabs(path) else os.path.join(log_root, path)


def lost_peer_line(step, peers, log_root, what):
    """The one line a process that lost its peers ends with.

    Args:
      step: the last step this process finished (None: not known).
      peers: who this process waits on, in words (`Distributor.peers`).
      log_root: the run directory, where the checkpoint is.
      what: how the loss showed: the engine's error, or the bound.
    """
    return _line(step, peers, newest_checkpoint(log_root), what)


def _line(step, peers, checkpoint, what):
    at = "" if step is None else f" after step {step}"
    resume = (
        f"the newest complete checkpoint is {checkpoint}, which the same "
        "command resumes from"
        if checkpoint
        else "no checkpoint was written yet: the same command starts over"
    )
    return (
        f"{LOST_PEER_LINE_START}{at} "
        f"({what}; waiting on {peers}); {resume} (exit code 4: a Slurm job "
        "of scripts/ requeues itself)"
    )


class PeerWatch:
    """Ends this process when no progress was marked for `bound_secs`.

    Use as a context manager around the part of the run that waits on
    peers; `mark(step)` at each point of progress. `peers` empty: a
    process without peers, which is not watched.

    The end is two POSIX timers whose expiry runs a C function in a
    thread of its own (`SIGEV_THREAD`): `warnx` of the line, then `_exit`
    with `LOST_PEER`. No Python runs then, so a thread that waits on the
    peers while holding the GIL (TensorFlow does, registering a function
    on a remote worker of a parameter-server cluster) cannot stop it, as
    it would a Python thread. Each mark pushes both back and rewrites the
    line (a few microseconds).
    """

    def __init__(
        self, bound_secs, peers, log_root, silence="no step, evaluation or save"
    ):
        self.bound_secs = bound_secs
        self.peers = peers
        self.log_root = log_root
        self.silence = silence  # What did not happen, for the line.
        self.step = None
        self._checkpoint = None
        self._timers = None

    def mark(self, step=None):
        """Progress: the bound starts again (`step`: the step finished).

        A mark without a step (around an evaluation or a save) also reads
        the newest checkpoint, which only a save changes.
        """
        if step is None:
            self._checkpoint = newest_checkpoint(self.log_root)
        else:
            self.step = step
        if self._timers is not None:
            self._timers.arm(self.bound_secs, self._fire_line())

    def line(self, what):
        """This process's lost-peer line at the current step."""
        return lost_peer_line(self.step, self.peers, self.log_root, what)

    def _fire_line(self):
        return _line(
            self.step,
            self.peers,
            self._checkpoint,
            f"{self.silence} for --peer_timeout_secs={self.bound_secs:g} s: "
            "a peer is gone, cut off or frozen",
        )

    def __enter__(self):
        if self.peers:
            self._timers = _ExitTimers()
        self.mark()
        return self

    def __exit__(self, *exc):
        if self._timers is not None:
            self._timers.close()
            self._timers = None


# Linux's `struct tcp_info`: the state (first byte; 1 is ESTABLISHED) and
# `tcpi_last_data_recv`, milliseconds since data last arrived.
_TCP_INFO_BYTES = 104
_ESTABLISHED = 1
_LAST_DATA_RECV_AT = 52
# The kernel counts `tcpi_last_data_recv` in jiffies (1-10 ms), so two
# readings of one arrival may place it up to that far apart: only a time
# later than this is new data.
_RECV_CLOCK_SLACK_SECS = 0.05


def last_received_secs():
    """Seconds since this process's TCP connections last received data.

    None with no connection established. Read with `TCP_INFO` from this
    process's own sockets (`/proc/self/fd`): the connections TensorFlow's
    gRPC server accepted and opened.
    """
    ages = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(name))) as sock:
                if sock.type != socket.SOCK_STREAM or sock.family not in (
                    socket.AF_INET,
                    socket.AF_INET6,
                ):
                    continue
                info = sock.getsockopt(
                    socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES
                )
        except OSError:  # Closed meanwhile, or not a TCP socket.
            continue
        if info[0] == _ESTABLISHED:
            ages.append(struct.unpack_from("I", info, _LAST_DATA_RECV_AT)[0])
    return min(ages) / 1e3 if ages else None


def watch_traffic(watch, every_secs=1.0):
    """Marks `watch` whenever this process's connections received data.

    A daemon thread, polling `last_received_secs` every `every_secs`; the
    watch's own timers end the process when the marks stop.
    """

    def poll():
        newest = None
        while True:
            time.sleep(every_secs)
            age = last_received_secs()
            if age is None:
                continue
            received = time.monotonic() - age
            if newest is None or received > newest + _RECV_CLOCK_SLACK_SECS:
                newest = received
                watch.mark()

    threading.Thread(
        target=poll, name="peer-watch-traffic", daemon=True
    ).start()


class _Sigevent(ctypes.Structure):
    """glibc's `struct sigevent` (64 bytes) for `SIGEV_THREAD`."""

    _fields_ = [
        ("value", ctypes.c_void_p),  # union sigval: an int or a pointer
        ("signo", ctypes.c_int),
        ("notify", ctypes.c_int),
        ("function", ctypes.c_void_p),  # void (*)(union sigval)
        ("attributes", ctypes.c_void_p),
        ("padding", ctypes.c_int * 8),
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


_SIGEV_THREAD = 2
_CLOCK_MONOTONIC = 1
# After the line's timer, so that the line is out before the process ends.
_EXIT_AFTER_LINE_SECS = 0.5


class _ExitTimers:
    """Two one-shot timers: `warnx(line)`, then `_exit(LOST_PEER)`."""

    def __init__(self):
        libc = ctypes.CDLL("librt.so.1", use_errno=True)  # glibc's timers
        self._libc = libc
        # warnx prints "<program name>: <its format>" to stderr, unbuffered;
        # the name is resnet_main's until `close` gives the library its own.
        self._name = ctypes.c_char_p(b"resnet_main")
        self._program = ctypes.c_void_p.in_dll(
            libc, "program_invocation_short_name"
        )
        self._own_name = self._program.value
        self._program.value = ctypes.cast(self._name, ctypes.c_void_p).value
        self._buffer = ctypes.create_string_buffer(_LINE_BYTES)
        self._line_timer = self._create(
            "warnx", ctypes.cast(self._buffer, ctypes.c_void_p).value
        )
        self._exit_timer = self._create("_exit", LOST_PEER)

    def _create(self, function, value):
        event = _Sigevent(
            value=value,
            notify=_SIGEV_THREAD,
            function=ctypes.cast(
                getattr(self._libc, function), ctypes.c_void_p
            ),
        )
        timer = ctypes.c_void_p()
        if self._libc.timer_create(
            _CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)
        ):
            raise OSError(ctypes.get_errno(), "timer_create")
        return timer

    def arm(self, secs, line):
        """Both timers `secs` from now, the line to print then.

        The timers first: pushed `secs` away, neither reads the line
        while it is rewritten.
        """
        for timer, after in (
            (self._line_timer, secs),
            (self._exit_timer, secs + _EXIT_AFTER_LINE_SECS),
        ):
            whole = int(after)
            spec = _Itimerspec(
                value=_Timespec(whole, int((after - whole) * 1e9))
            )
            if self._libc.timer_settime(timer, 0, ctypes.byref(spec), None):
                raise OSError(ctypes.get_errno(), "timer_settime")
        # It is warnx's format: no conversion may come from a path.
        text = line.removeprefix("resnet_main: ").replace("%", "%%")
        data = text.encode()[: _LINE_BYTES - 1] + b"\0"
        ctypes.memmove(self._buffer, data, len(data))

    def close(self):
        for timer in (self._exit_timer, self._line_timer):
            self._libc.timer_delete(timer)
        self._program.value = self._own_name


_LINE_BYTES = 4096

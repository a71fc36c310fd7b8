"""Keeps TensorFlow's native INFO chatter off a training process's stderr.

TensorFlow's gRPC servers and cluster services log through absl's C++
logging, which ignores `TF_CPP_MIN_LOG_LEVEL`: each server prints absl's
warning that its logging is uninitialised and a start line, and each
connection of a parameter-server coordinator makes every server dump its
whole session config (about 20 lines). Python cannot reach absl's C++
threshold, so `filter_stderr` sends the process's stderr (file descriptor
2, which C++ writes to) through a small filter process that drops exactly
those INFO lines (`QUIET_FILES`, with a dump's continuation lines) and
passes every other line as it comes. It drops the few warnings that every
distributed run prints and that ask nothing of a user
(`HARMLESS_WARNINGS`) too.

The filter is a process of its own, not a thread, so that nothing is lost
when the training process dies abruptly (a C++ check failure writes its
message and aborts): it reads until the last writer closes the pipe. For
the same reason it ignores the signals that stop a job (SIGINT from a
terminal, SIGTERM and SIGHUP from a scheduler): the process's last words
on a signal still arrive.

This file runs as the filter (`python -S -E native_log.py`), so it imports
nothing but the standard library.
"""

import atexit
import os
import re
import signal
import subprocess
import sys

# C++ files whose INFO lines carry nothing for a user: the gRPC server's
# start, the eager service's session config on each connection, the
# coordination agent's "connected".
QUIET_FILES = (
    "grpc_server_lib.cc",
    "eager_service_impl.cc",
    "coordination_service_agent.cc",
)
# absl's own line, once per process that logs from C++ before absl's
# logging is initialised (TensorFlow never initialises it).
ABSL_UNINITIALISED = (
    b"WARNING: All log messages before absl::InitializeLog() is called"
    b" are written to STDERR"
)
# TensorFlow warnings that every run of a distributed mode prints and that
# ask nothing of a user: tf.distribute's multi-device iterator feeds
# replicas through a generator dataset, whose input tf.data cannot rewrite
# (tensorflow/tensorflow#61816; Ray Train prints it too, ray#25141).
HARMLESS_WARNINGS = (
    b"Input of GeneratorDatasetOp::Dataset will not be optimized because",
)
# An absl INFO line: `I1125 18:15:23.161704     525 file.cc:464] text`.
_INFO = re.compile(rb"^I\d{4} [\d:.]+ +\d+ ([\w.]+):\d+\] ")
# A TensorFlow warning: `2026-11-25 18:15:26.758605: W path/file.cc:993] `.
_WARNING = re.compile(rb"^[\d-]+ [\d:.]+: W [\w/.]+:\d+\] ")
# A line of a text proto: `key: value`, `name {`, `}`.
_PROTO = re.compile(rb"^ *(\w+: .*|\w+ \{|\})$")


def quiet(line):
    """Whether a line (bytes, without its newline) is one to drop."""
    if line == ABSL_UNINITIALISED:
        return True
    warning = _WARNING.match(line)
    if warning:
        return line[warning.end() :].startswith(HARMLESS_WARNINGS)
    match = _INFO.match(line)
    return bool(match) and match.group(1).decode() in QUIET_FILES


def filter_lines(lines, write):
    """Writes each line of `lines` that `quiet` keeps, and a dump's tail.

    A dropped line that opens a text proto (`SessionOptions: ... {`) drops
    the proto's lines after it, up to and including the blank line that
    ends the dump; the first line that is not a proto's ends that early and
    is written (a traceback right after a dump is never lost).
    """
    in_dump = False
    for line in lines:
        text = line.rstrip(b"\r\n")
        if in_dump:
            if not text:
                in_dump = False
                continue
            if _PROTO.match(text):
                continue
            in_dump = False
        if quiet(text):
            in_dump = text.endswith(b"{")
            continue
        write(line)


def _run_filter():
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    out = sys.stdout.buffer

    def write(line):
        out.write(line)
        out.flush()

    filter_lines(iter(sys.stdin.buffer.readline, b""), write)


_filter = None


def filter_stderr():
    """Sends this process's stderr through the filter, once per process.

    At a normal exit the process's own stderr comes back and the filter is
    waited for, so no filter outlives its process; after an abrupt end it
    exits as soon as it has passed what was written.
    """
    global _filter
    if _filter is not None:
        return
    sys.stderr.flush()
    original = os.dup(2)
    read, write = os.pipe()
    _filter = subprocess.Popen(
        [sys.executable, "-S", "-E", os.path.abspath(__file__)],
        stdin=read,
        stdout=original,
        stderr=original,
    )
    os.close(read)
    os.dup2(write, 2)
    os.close(write)
    atexit.register(_restore_stderr, original)


def _restore_stderr(original):
    sys.stderr.flush()
    os.dup2(original, 2)  # Closes the pipe: the filter reads its end.
    os.close(original)
    try:
        _filter.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _filter.kill()


if __name__ == "__main__":
    _run_filter()

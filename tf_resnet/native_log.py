"""Keeps TensorFlow's native log chatter off a training process's stderr.

TensorFlow's C++ logs partly through absl's logging, which ignores
`TF_CPP_MIN_LOG_LEVEL`: a gRPC server prints absl's warning that its
logging is uninitialised and a start line; each connection of a
parameter-server coordinator makes every server dump its whole session
config (about 20 lines); from TensorFlow 2.21 every import prints its
oneDNN notice this way. Python cannot reach absl's C++ threshold, so
`filter_stderr` sends the process's stderr (file descriptor 2, which C++
writes to) through a small filter process that applies
`TF_CPP_MIN_LOG_LEVEL` to those lines (absl's C++ lines, with a dump's
continuation lines) and passes every other line as it comes. From level 1
on it drops the few warnings that every run of a kind prints and that ask
nothing of a user (`HARMLESS`) too. Python's lines (ours, TensorFlow's,
Keras') and anything not in these formats pass untouched.

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

# Warnings every run of a kind prints that ask nothing of a user.
HARMLESS = (
    # tf.distribute's multi-device iterator feeds replicas through a
    # generator dataset, whose input tf.data cannot rewrite (every
    # distributed mode; tensorflow/tensorflow#61816, ray#25141).
    b"Input of GeneratorDatasetOp::Dataset will not be optimized because",
    # A cast to float16 (--gradient_compression=fp16) on a CPU whose
    # oneDNN lacks float16: TensorFlow's Eigen kernel does it instead.
    b"oneDNN supports DT_HALF only on platforms with AVX-512.",
    # Ray Train 2.60's own actor, on every run (ray-project/ray#53727).
    b"Actor with class name: 'PreemptionWatcher' and ID:",
)
# absl's line, once per process that logs from C++ before absl's logging is
# initialised (TensorFlow never initialises it).
ABSL_UNINITIALISED = (
    b"WARNING: All log messages before absl::InitializeLog() is called"
    b" are written to STDERR"
)
_SEVERITIES = b"IWEF"  # By TF_CPP_MIN_LOG_LEVEL's numbers: 0 1 2 3.
# absl's C++ line: `I1125 18:15:23.161704     525 file.cc:464] text`;
# Python's absl lines name a `.py` file and pass.
_ABSL_NATIVE = re.compile(
    rb"^([IWEF])\d{4} [\d:.]+ +\d+ [\w.]+\.(?:cc|h):\d+\] "
)
# The other formats, whose level their writers already chose: TensorFlow's
# own logging (`2026-11-25 18:15:26.758605: W path/file.cc:993] `) and
# Ray's (`[2026-11-25 18:30:33,824 E 591 621] file.cc:2465: `).
_OTHER_NATIVE = re.compile(
    rb"^(?:[\d-]+ [\d:.]+: [IWEF] [\w/.]+:\d+\] "
    rb"|\[[\d-]+ [\d:,]+ [IWEF] \d+ \d+\] [\w.]+:\d+: )"
)
# Ray's driver marks each line of an actor: `(RayTrainWorker pid=679) `,
# coloured on a terminal.
_RAY_ACTOR = re.compile(rb"^(?:\x1b\[\d+m)?\(\w+ pid=\d+[^)]*\)(?:\x1b\[0m)? ")
# A line of a text proto: `key: value`, `name {`, `}`.
_PROTO = re.compile(rb"^ *(\w+: .*|\w+ \{|\})$")
# The second line of TensorFlow's CPU-feature notice.
_NOTICE_TAIL = b"To enable the following instructions:"


# What TensorFlow's `TF_CPP_MIN_LOG_LEVEL` is here unless a user sets it:
# warnings and errors, no INFO.
DEFAULT_MIN_LEVEL = "1"


def default_level():
    """Sets `TF_CPP_MIN_LOG_LEVEL` to `DEFAULT_MIN_LEVEL` unless it is set.

    Before TensorFlow is imported: its own logging reads it then.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_MIN_LEVEL)


def min_level():
    """`TF_CPP_MIN_LOG_LEVEL` as TensorFlow reads it (0 when unset)."""
    value = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")
    return int(value) if value.isdigit() else 0


def _body(line):
    """`line` (bytes, no newline) without Ray's mark of an actor."""
    actor = _RAY_ACTOR.match(line)
    return line[actor.end() :] if actor else line


def quiet(body, level):
    """Whether a line's `_body` is one to drop at `level`."""
    if level < 1:  # TensorFlow's default: everything shows.
        return False
    if body == ABSL_UNINITIALISED:
        return True
    native = _ABSL_NATIVE.match(body)
    if native:
        if _SEVERITIES.index(native.group(1)) < level:
            return True
        return body[native.end() :].startswith(HARMLESS)
    other = _OTHER_NATIVE.match(body)
    return bool(other) and body[other.end() :].startswith(HARMLESS)


def filter_lines(lines, write, level):
    """Writes each line of `lines` that `quiet` keeps at `level`.

    A dropped line that opens a text proto (`SessionOptions: ... {`) drops
    the proto's lines after it, up to and including the blank line that
    ends the dump; the first line that is not a proto's ends that early and
    is written (a traceback right after a dump is never lost). A dropped
    CPU-feature notice takes its second line with it.
    """
    in_dump = after_notice = False
    for line in lines:
        body = _body(line.rstrip(b"\r\n"))
        if in_dump:
            if not body:
                in_dump = False
                continue
            if _PROTO.match(body):
                continue
            in_dump = False
        if after_notice:
            after_notice = False
            if body.startswith(_NOTICE_TAIL):
                continue
        if quiet(body, level):
            in_dump = body.endswith(b"{")
            after_notice = True
            continue
        write(line)


def _run_filter():
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    out = sys.stdout.buffer

    def write(line):
        out.write(line)
        out.flush()

    filter_lines(iter(sys.stdin.buffer.readline, b""), write, min_level())


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
    default_level()
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

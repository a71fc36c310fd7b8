"""The stderr filter that keeps TensorFlow's C++ server chatter off the log.

The lines below are TensorFlow 2.18's own, as a parameter-server task
prints them when the coordinator connects (absl's C++ logging, which
`TF_CPP_MIN_LOG_LEVEL` does not reach).
"""

import os
import signal
import subprocess
import sys
import textwrap

from tests.helpers import ROOT
from tf_resnet import native_log

DUMP = b"""\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795630523.161704     525 grpc_server_lib.cc:464] Started server with target: grpc://localhost:34200
I1125 18:15:23.161785 139779507796864 parameter_server.py:143] ps task 0 serving at grpc://localhost:34200
I0000 00:00:1795630525.617785     642 eager_service_impl.cc:350] Creating sync eager service context with rendezvous_id on host vm /job:ps/replica:0/task:0
I0000 00:00:1795630525.617824     642 eager_service_impl.cc:356] SessionOptions: device_count {
  key: "CPU"
  value: 1
}
gpu_options {
  experimental {
  }
}
allow_soft_placement: true

I0000 00:00:1795630604.810856    2030 coordination_service_agent.cc:340] Coordination agent has successfully connected.
W0000 00:00:1795630604.810856    2030 grpc_server_lib.cc:99] a warning stays
2026-11-25 18:15:26.758605: W tensorflow/core/framework/dataset.cc:993] Input of GeneratorDatasetOp::Dataset will not be optimized because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.
2026-11-25 18:15:26.758605: W tensorflow/core/framework/dataset.cc:993] Input of MyDatasetOp::Dataset will not be optimized
I1125 18:15:29.049812 140171505388416 train_loop.py:233] step 2/2 (100.0%)
"""  # noqa: E501


def filtered(data):
    out = []
    native_log.filter_lines(data.splitlines(keepends=True), out.append)
    return b"".join(out)


def test_the_server_chatter_goes_and_every_other_line_stays():
    assert filtered(DUMP).decode().splitlines() == [
        "I1125 18:15:23.161785 139779507796864 parameter_server.py:143] "
        "ps task 0 serving at grpc://localhost:34200",
        "W0000 00:00:1795630604.810856    2030 grpc_server_lib.cc:99] "
        "a warning stays",
        "2026-11-25 18:15:26.758605: W tensorflow/core/framework/dataset.cc:"
        "993] Input of MyDatasetOp::Dataset will not be optimized",
        "I1125 18:15:29.049812 140171505388416 train_loop.py:233] "
        "step 2/2 (100.0%)",
    ]


def test_a_traceback_right_after_a_dump_is_kept():
    dump_then_traceback = DUMP.split(b"allow_soft")[0] + (
        b"Traceback (most recent call last):\n"
        b'  File "x.py", line 1, in <module>\n'
    )
    assert filtered(dump_then_traceback).endswith(
        b"Traceback (most recent call last):\n"
        b'  File "x.py", line 1, in <module>\n'
    )


def _run(body):
    """Runs `body` in a fresh Python whose stderr goes through the filter."""
    code = textwrap.dedent(
        """
        import os, signal, sys
        from tf_resnet import native_log
        native_log.filter_stderr()
        """
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_the_last_words_of_a_killed_process_arrive():
    # C++ writes straight to file descriptor 2 and may abort right after.
    result = _run(
        f"""
        os.write(2, {DUMP!r})
        os.write(2, b"F0000 fatal: check failed\\n")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert result.returncode == -signal.SIGKILL
    lines = result.stderr.decode().splitlines()
    assert lines[-1] == "F0000 fatal: check failed", lines
    assert not any("SessionOptions" in line for line in lines), lines


def test_a_normal_exit_leaves_no_filter_and_keeps_its_code():
    result = _run(
        """
        print(native_log._filter.pid)
        print("an error of ours", file=sys.stderr)
        sys.exit(3)
        """
    )
    assert result.returncode == 3
    assert result.stderr == b"an error of ours\n"
    assert not os.path.exists(f"/proc/{int(result.stdout)}")

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


# TensorFlow 2.21's import, and a Ray actor's lines as its driver prints
# them on a terminal.
IMPORT_2_21 = b"""\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795631485.372197     359 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results.
I0000 00:00:1795631521.379994     839 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
To enable a line of ours
"""  # noqa: E501
RAY = b"""\
\x1b[36m(RayTrainWorker pid=679)\x1b[0m WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
\x1b[36m(RayTrainWorker pid=679)\x1b[0m W0000 00:00:1795631450.939104     907 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.
\x1b[36m(TrainController pid=591)\x1b[0m [2026-11-25 18:30:33,824 E 591 621] core_worker.cc:2465: Actor with class name: 'PreemptionWatcher' and ID: '84d036e8e08f7476d34b7c1c01000000' has constructor arguments in the object store
\x1b[36m(TrainController pid=591)\x1b[0m [2026-11-25 18:30:33,824 E 591 621] core_worker.cc:2465: Actor with class name: 'Other' is a real error
\x1b[36m(RayTrainWorker pid=679)\x1b[0m I1125 18:31:05.479324 140118230809472 resnet_main.py:83] done: step 40
"""  # noqa: E501


def filtered(data, level=1):
    out = []
    native_log.filter_lines(data.splitlines(keepends=True), out.append, level)
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


def test_tf_cpp_min_log_level_applies_to_absl_lines_too():
    # 0, TensorFlow's default, shows every line.
    assert filtered(DUMP, level=0) == DUMP
    # 2 drops warnings too; an error stays.
    error = b"E0000 00:00:1795630604.810856    2030 grpc_server_lib.cc:9] x\n"
    assert filtered(DUMP + error, level=2).splitlines()[-2:] == [
        b"I1125 18:15:29.049812 140171505388416 train_loop.py:233] "
        b"step 2/2 (100.0%)",
        error.strip(),
    ]


def test_the_import_notices_of_tensorflow_2_21_go():
    assert filtered(IMPORT_2_21) == b"To enable a line of ours\n"


def test_ray_actor_lines_are_filtered_after_their_mark():
    assert filtered(RAY).decode().splitlines() == [
        "\x1b[36m(TrainController pid=591)\x1b[0m [2026-11-25 18:30:33,824 "
        "E 591 621] core_worker.cc:2465: Actor with class name: 'Other' is "
        "a real error",
        "\x1b[36m(RayTrainWorker pid=679)\x1b[0m I1125 18:31:05.479324 "
        "140118230809472 resnet_main.py:83] done: step 40",
    ]


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
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1"},
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

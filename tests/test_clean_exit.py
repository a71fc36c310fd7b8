"""A finished run exits at once: no pause after the final evaluation.

The pause came from tf.data's autotuning thread, which an iterator's
destructor joins and which can miss its wake-up and sleep out the rest of
its optimization period (see `pipeline.pipeline_options`). It happened in
about one of five dropped iterators, for as long as the period had left, so
the iterator test below drops many iterators, each after it has lived long
enough for a missed wake-up to cost seconds.
"""

import os
import subprocess
import sys
import threading
import time

import pytest

from tests.helpers import ROOT, one_per_set
from tf_resnet import data


@pytest.mark.slow
def test_dropping_the_training_iterator_never_waits(synthetic_cifar):
    # The autotuner optimizes at about 2.5 s and 5.1 s of an iterator's
    # life: dropped at 2.8 s, a missed wake-up would block for over 2 s.
    # With the autotuner on, 3 of 15 such drops stalled (4.2 s each at 6 s).
    teardowns = []
    for _ in range(15):
        split = data.open_split(
            "cifar10", synthetic_cifar["train"], training=True
        )
        dataset = split.dataset(32)
        iterator = iter(dataset)
        stop = time.monotonic() + 2.8
        while time.monotonic() < stop:
            next(iterator)
            time.sleep(0.02)  # A training step, during which tf.data works.
        start = time.monotonic()
        del iterator
        teardowns.append(time.monotonic() - start)
    assert max(teardowns) < 1.0, [round(t, 2) for t in teardowns]


def timed_stderr_lines(proc):
    """`(arrival time, line)` of the process's stderr, read as it comes."""
    lines = []

    def read():
        for line in proc.stderr:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def run_to_the_end(synthetic_cifar, log_root):
    """Trains to the end; returns seconds from the final eval to done/exit."""
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "resnet_main.py"),
            f"--train_data_path={synthetic_cifar['train']}",
            f"--eval_data_path={synthetic_cifar['eval']}",
            f"--log_root={log_root}",
            "--train_steps=40",
            "--batch_size=32",
            "--eval_every_steps=20",
            "--eval_batch_count=2",
            "--log_every_steps=10",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    lines, reader = timed_stderr_lines(proc)
    proc.wait(timeout=300)
    exited = time.monotonic()
    reader.join(timeout=10)
    text = "".join(line for _, line in lines)
    assert proc.returncode == 0, text[-2000:]
    final_eval = [t for t, line in lines if "eval at step 40:" in line]
    done = [t for t, line in lines if "done:" in line]
    assert final_eval and done, text[-2000:]
    return done[0] - final_eval[0], exited - final_eval[0]


@pytest.mark.slow
@pytest.mark.parametrize("run", one_per_set(1, 2))
def test_training_exits_within_seconds_of_the_final_eval(
    synthetic_cifar, tmp_path, run
):
    del run  # Repeated: a missed wake-up happened in one run of five.
    # One run on each set (tests/helpers.py).
    to_done, to_exit = run_to_the_end(synthetic_cifar, tmp_path / "run")
    assert to_done < 2.0
    assert to_exit < 10.0

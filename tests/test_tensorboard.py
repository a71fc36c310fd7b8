"""The README's viewer: the real `tensorboard --logdir` serves a run's series.

Reading event files with `EventAccumulator` (as `helpers.scalars` does) does
not start TensorBoard, so it cannot catch an environment in which the
viewer itself fails to import (setuptools without `pkg_resources`). This
starts the `tensorboard` of the project's environment on 127.0.0.1 and asks
its HTTP API for what the summaries module wrote.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tf_resnet import summaries

# The environment the tests run in is the one `setup.sh` links at .venv.
TENSORBOARD = os.path.join(os.path.dirname(sys.executable), "tensorboard")
TRAIN_LOSS = {10: 2.25, 20: 1.5, 30: 0.875}
EVAL = {
    15: {"precision": 0.375, "precision_at_5": 0.875, "loss": 1.75},
    30: {"precision": 0.625, "precision_at_5": 0.9375, "loss": 1.125},
}


def write_run(log_root):
    """A small run's events, written as the training loop writes them."""
    train = summaries.ScalarWriter(os.path.join(log_root, "train"))
    evaluation = summaries.EvalWriter(os.path.join(log_root, "eval"))
    for step, loss in TRAIN_LOSS.items():
        train.write(step, {"loss": loss, "accuracy": 0.5})
    best = 0.0
    for step, result in EVAL.items():
        best = max(best, result["precision"])
        evaluation.write(step, result, best)
    train.close()
    evaluation.close()


def server_url(output_path, proc, timeout):
    """The address TensorBoard prints once it listens (`--port=0`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(output_path) as stream:
            output = stream.read()
        match = re.search(r"at (http://127\.0\.0\.1:\d+/)", output)
        if match:
            return match.group(1)
        if proc.poll() is not None:
            pytest.fail(f"tensorboard exited with {proc.returncode}:\n{output}")
        time.sleep(0.2)
    pytest.fail(f"tensorboard printed no address in {timeout} s:\n{output}")


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def wait_for_tags(base, timeout):
    """Polls until both runs are loaded (TensorBoard reads in background)."""
    deadline = time.monotonic() + timeout
    tags = {}
    while time.monotonic() < deadline:
        tags = get_json(base + "data/plugin/scalars/tags")
        if "Precision" in tags.get("eval", {}) and "loss" in tags.get(
            "train", {}
        ):
            return tags
        time.sleep(0.5)
    pytest.fail(f"runs not loaded after {timeout} s; tags: {tags}")


def series(base, run, tag):
    """`{step: value}` of one scalar series, from TensorBoard's HTTP API."""
    query = urllib.parse.urlencode({"run": run, "tag": tag})
    rows = get_json(f"{base}data/plugin/scalars/scalars?{query}")
    return {step: value for _wall_time, step, value in rows}


@pytest.fixture
def tensorboard(tmp_path):
    """Starts `tensorboard --logdir=<a run>`; yields its base URL."""
    log_root = tmp_path / "run"
    write_run(str(log_root))
    output_path = tmp_path / "tensorboard.log"
    with open(output_path, "w") as output:
        # Its own session, so the data server it spawns goes down with it.
        proc = subprocess.Popen(
            [
                TENSORBOARD,
                f"--logdir={log_root}",
                "--host=127.0.0.1",
                "--port=0",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield server_url(output_path, proc, timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_tensorboard_serves_precision_and_loss_of_a_run(tensorboard):
    tags = wait_for_tags(tensorboard, timeout=60)
    assert set(tags) == {"train", "eval"}
    assert set(tags["eval"]) == {
        "Precision",
        "Best Precision",
        "Precision@5",
        "loss",
    }
    assert series(tensorboard, "eval", "Precision@5") == {
        step: pytest.approx(r["precision_at_5"]) for step, r in EVAL.items()
    }
    assert series(tensorboard, "eval", "Precision") == {
        step: pytest.approx(r["precision"]) for step, r in EVAL.items()
    }
    assert series(tensorboard, "eval", "Best Precision") == {
        15: pytest.approx(0.375),
        30: pytest.approx(0.625),
    }
    assert series(tensorboard, "eval", "loss") == {
        step: pytest.approx(r["loss"]) for step, r in EVAL.items()
    }
    assert series(tensorboard, "train", "loss") == {
        step: pytest.approx(loss) for step, loss in TRAIN_LOSS.items()
    }

"""The Ray launcher ends a run whose node was cut off, within the bound.

A two-node Ray cluster of its own (`tests/test_ray.py`'s `Cluster`: the
cut leaves Ray counting a dead node, which no later test could use), the
workers spread over both nodes, and node2's link cut for good
(`ip link set veth1 down`) in the middle of training. The worker on node1
loses its peer and exits 4; the launcher's restart cannot start its
workers while Ray still counts node2, and the launcher then ends the run
with exit 4 and its line last, within the bound and a minute, whatever
restarts are left (`launch.ray.could_not_restart`). A run from the
checkpoint the worker's line names resumes from it.

Its own module: `test_ray.py`'s cluster holds the one-cluster lock for
the whole of that module.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import ray_cluster
from tests.engine_runs import WORKER
from tests.ray_cluster import ray_resnet8_flags, read

BOUND = 20


@pytest.fixture
def own_cluster():
    with ray_cluster.running() as started:
        yield started


@pytest.mark.cluster
@pytest.mark.slow
def test_a_cut_link_ends_the_run_with_the_launchers_line(
    own_cluster, synthetic_cifar, tmp_path
):
    log_root = tmp_path / "log"
    flags = ray_resnet8_flags(
        synthetic_cifar, log_root, "--train_steps=100000",
        "--checkpoint_every_steps=5", "--eval_every_steps=100000",
        "--log_every_steps=1", f"--peer_timeout_secs={BOUND}",
    )  # fmt: skip
    process, output = own_cluster.launch(flags, tmp_path / "dump")
    try:
        deadline = time.monotonic() + 300
        while not re.search(r"\] step 12/", read(output)):
            assert process.poll() is None, read(output)[-5000:]
            assert time.monotonic() < deadline, read(output)[-5000:]
            time.sleep(0.2)
        own_cluster.run(1, ["ip", "link", "set", "veth1", "down"])
        cut_at = time.monotonic()
        code = process.wait(timeout=BOUND + 60)
        took = time.monotonic() - cut_at
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = read(output)
    assert code == 4, text[-5000:]
    assert took < BOUND + 60, f"{took:.0f} s\n{text[-5000:]}"
    assert (
        text.strip()
        .splitlines()[-1]
        .startswith(
            "launch.ray: error: the workers could not start again after losing "
            "a peer"
        )
    ), text[-5000:]
    # A worker's own line: the checkpoint a rerun resumes from.
    found = re.search(
        r"lost a task of the training cluster after step \d+ .*?the newest "
        r"complete checkpoint is (\S+/ckpt-(\d+)), which",
        text,
    )
    assert found, text[-5000:]
    (tmp_path / "rerun").mkdir()
    rerun = subprocess.run(
        [sys.executable, WORKER, f"--dump_dir={tmp_path}/rerun",
         *flags, "--distribution=default", "--steps_per_run=1",
         f"--train_steps={int(found[2]) + 1}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {found[1]} at step {found[2]}" in rerun.stderr

"""A cut link between two nodes ends the run within --peer_timeout_secs.

Two network-namespace nodes joined by one veth pair (`tests/two_nodes.py`),
one process of the run on each, started as the docs say: `horovodrun -H`
for Horovod, `--worker_hosts --task_index` for `multi_worker`. In the
middle of training, `ip link set eth0 down` on node2: no connection is
reset, the peers just go silent. The process on node1 must end within the
bound with exit code 4, the lost-peer line as its last (the step, the peer,
the newest complete checkpoint and that the same command resumes), and
that checkpoint must be the one a rerun resumes from.

The bound is 20 s (`--peer_timeout_secs=20`): below Gloo's own 30 s
timeout, so under horovodrun it is the peer watch that ends the rank, as
it is under MPI (which has no timeout at all); `multi_worker`'s own health
check may come first. Each test waits for the run to end, at most the
bound and a minute.
"""

import os
import re
import subprocess
import sys
import time

import pytest

from tests import engine_runs, two_nodes
from tests.helpers import ROOT, requires_horovod, resnet8_flags

BOUND = 20
WORKER = engine_runs.WORKER

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(two_nodes.usable()), reason=two_nodes.usable()),
]


@pytest.fixture
def nodes():
    with two_nodes.Nodes() as made:
        yield made


def partition_flags(synthetic_cifar, log_root, *extra):
    """ResNet-8 for good, a checkpoint every 5 steps, the bound 20 s."""
    os.makedirs(f"{log_root}_dump", exist_ok=True)
    return resnet8_flags(
        synthetic_cifar, log_root, "--dtype=float32", "--train_steps=100000",
        "--checkpoint_every_steps=5", "--log_every_steps=1",
        "--eval_every_steps=100000", f"--peer_timeout_secs={BOUND}", *extra,
    )  # fmt: skip


def cut_after(process, nodes, step):
    """Reads `process`'s output until `step` is logged, then cuts the link.

    Returns the lines read and the time of the cut.
    """
    lines = []
    for line in process.stdout:
        lines.append(line)
        if re.search(rf"\] step {step}/", line):
            nodes.cut()
            return lines, time.monotonic()
    pytest.fail("the run ended before the cut:\n" + "".join(lines[-40:]))


def end_of(process, lines, cut_at):
    """Waits for the run to end (the bound and a minute at most)."""
    try:
        rest, _ = process.communicate(timeout=BOUND + 60)
    finally:
        if process.poll() is None:
            process.kill()
    lines.extend(rest.splitlines(keepends=True))
    return "".join(lines), time.monotonic() - cut_at


LOST = (
    r"resnet_main: error: lost a task of the training cluster after step "
    r"(\d+) \((.*); waiting on {peer}\); the newest complete checkpoint is "
    r"(\S+/ckpt-(\d+)), which the same command resumes from"
)


def assert_resumes(nodes, synthetic_cifar, log_root, checkpoint):
    """A rerun in `log_root` starts from `checkpoint` (one process, a step)."""
    rerun = subprocess.run(
        [*nodes.enter("node1"), sys.executable, WORKER,
         f"--dump_dir={log_root}_dump",
         *partition_flags(synthetic_cifar, log_root, "--steps_per_run=1",
                          "--distribution=default")],
        env=nodes.env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    step = checkpoint.rpartition("-")[2]
    assert f"resumed from {checkpoint} at step {step}" in rerun.stderr, (
        rerun.stderr[-3000:]
    )


@requires_horovod
def test_a_cut_link_ends_horovod_ranks_within_the_bound(
    nodes, synthetic_cifar, tmp_path
):
    log_root = tmp_path / "log"
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    hosts = ",".join(f"{address}:1" for address in two_nodes.ADDRESSES.values())
    process = subprocess.Popen(
        [*nodes.enter("node1"), horovodrun, "-np", "2", "-H", hosts,
         "--gloo", "--network-interface", "eth0", sys.executable, WORKER,
         f"--dump_dir={log_root}_dump", "--distribution=horovod",
         *partition_flags(synthetic_cifar, log_root)],
        env=nodes.env(), cwd=ROOT, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    lines, cut_at = cut_after(process, nodes, 12)
    output, took = end_of(process, lines, cut_at)
    assert process.returncode != 0, output[-3000:]
    # The watch checks 10 times per bound; horovodrun then ends rank 1.
    assert took < BOUND + 30, f"{took:.0f} s\n{output[-3000:]}"
    rank0 = [
        line.split("<stderr>:", 1)[1]
        for line in output.splitlines()
        if line.startswith("[0]<stderr>:")
    ]
    # Rank 0's last words: the line, after a step of the cut or later.
    found = re.match(LOST.format(peer=r"rank 1 on node2"), rank0[-1])
    assert found, output[-3000:]
    assert f"--peer_timeout_secs={BOUND}" in found[2]
    assert int(found[1]) >= 12 and int(found[4]) >= 10, found[0]
    # horovodrun says what it saw after that: rank 0 exited with 4.
    assert "Exit code: 4" in output.split(found[0])[-1], output[-2000:]
    assert_resumes(nodes, synthetic_cifar, log_root, found[3])


def test_a_cut_link_ends_a_multi_worker_within_the_bound(
    nodes, synthetic_cifar, tmp_path
):
    log_root = tmp_path / "log"
    workers = ",".join(
        f"{address}:{port}"
        for address, port in zip(
            two_nodes.ADDRESSES.values(), (23456, 23457), strict=True
        )
    )
    processes = [
        subprocess.Popen(
            [
                *nodes.enter(node),
                sys.executable,
                WORKER,
                f"--dump_dir={log_root}_dump",
                "--distribution=multi_worker",
                f"--worker_hosts={workers}",
                f"--task_index={index}",
                *partition_flags(synthetic_cifar, log_root),
            ],
            env=nodes.env(),
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for index, node in enumerate(two_nodes.ADDRESSES)
    ]
    try:
        lines, cut_at = cut_after(processes[0], nodes, 12)
        output, took = end_of(processes[0], lines, cut_at)
    finally:
        processes[1].kill()
        processes[1].communicate()
    assert processes[0].returncode == 4, output[-3000:]
    assert took < BOUND + 30, f"{took:.0f} s\n{output[-3000:]}"
    last = output.strip().splitlines()[-1]
    found = re.match(LOST.format(peer=r"worker 1 on 10\.78\.0\.2:23457"), last)
    assert found, output[-3000:]
    assert int(found[1]) >= 12 and int(found[4]) >= 10, found[0]
    assert_resumes(nodes, synthetic_cifar, log_root, found[3])

"""A cut link between two nodes ends the run within --peer_timeout_secs.

Two network-namespace nodes joined by one veth pair (`tests/two_nodes.py`),
the processes of the run on both, started as the docs say: `horovodrun -H`
for Horovod, `--worker_hosts --task_index` for `multi_worker`, the ps and
the coordinator on node1 and the worker on node2 for `parameter_server`.
In the middle of training, `ip link set eth0 down` on node2: no
connection is reset, the peers just go silent. The process on node1 must
end within the bound with exit code 4, the lost-peer line as its last
(the step, the peer, the newest complete checkpoint and that the same
command resumes), and that checkpoint must be the one a rerun resumes
from. The first test checks the watch alone, in a process of its own.

The bound is 20 s (`--peer_timeout_secs=20`): below Gloo's own 30 s
timeout, so under horovodrun it is the peer watch that ends the rank, as
it is under MPI (which has no timeout at all); `multi_worker`'s own health
check may come first. Each test waits for the run to end, at most the
bound and a minute.
"""

import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from tests import engine_runs, two_nodes
from tests.helpers import (
    ROOT,
    on_newest_set,
    on_one_set,
    requires_horovod,
    resnet8_flags,
)
from tf_resnet import peer_watch

BOUND = 20
WORKER = engine_runs.WORKER

# Two namespace nodes need root and the tools.
on_two_nodes = pytest.mark.skipif(
    bool(two_nodes.usable()), reason=two_nodes.usable()
)

SILENT = """
import ctypes, sys, time
from tf_resnet import peer_watch
bound, log_root, steps = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with peer_watch.PeerWatch(bound, "rank 1 on node2", log_root) as watch:
    watch.mark(7)
    for step in range(8, 8 + steps):  # Steps of 0.2 s: progress.
        time.sleep(0.2)
        watch.mark(step)
    # A collective that never returns, holding the GIL as TensorFlow's
    # remote function registration does (a PyDLL call keeps it).
    ctypes.PyDLL(None).sleep(60)
"""


def test_the_watch_ends_a_silent_process_with_its_line(tmp_path):
    # A checkpoint index as TensorFlow writes it, after the files.
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", SILENT, "1", str(tmp_path), "10"],
        capture_output=True, text=True, timeout=30, cwd=ROOT,
    )  # fmt: skip
    took = time.monotonic() - started
    assert result.returncode == 4, result.stderr
    # 10 steps of 0.2 s kept it alive past its 1 s bound; then 1 s of
    # silence ended it.
    assert 3 <= took < 6, took
    assert result.stderr.splitlines()[-1] == (
        "resnet_main: error: lost a task of the training cluster after "
        "step 17 (no step, evaluation or save for --peer_timeout_secs=1 s: "
        "a peer is gone, cut off or frozen; waiting on rank 1 on node2); the "
        f"newest complete checkpoint is {tmp_path}/ckpt-10, which the same "
        "command resumes from (exit code 4: a Slurm job of scripts/ "
        "requeues itself)"
    )


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


def start_on(nodes, node, *command, **env):
    """`command` on `node`; its output and errors on one pipe."""
    return subprocess.Popen(
        [*nodes.enter(node), *command], env=nodes.env(**env), cwd=ROOT,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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


@pytest.mark.slow
@on_two_nodes
@requires_horovod
def test_a_cut_link_ends_horovod_ranks_within_the_bound(
    nodes, synthetic_cifar, tmp_path
):
    """horovodrun across the nodes, started by the launcher as the docs say.

    The watch ends each rank at the bound; horovodrun then ends the job
    with its traceback, and the launcher says rank 0's line again, last.
    """
    log_root = tmp_path / "log"
    hosts = ",".join(f"{address}:1" for address in two_nodes.ADDRESSES.values())
    process = start_on(
        nodes, "node1", sys.executable, "-m", "tf_resnet.launch.horovod",
        "--np=2", f"--hosts={hosts}", "--network=host",
        "--network_interface=eth0", f"--main={WORKER}", "--",
        f"--dump_dir={log_root}_dump", "--distribution=horovod",
        *partition_flags(synthetic_cifar, log_root),
    )  # fmt: skip
    lines, cut_at = cut_after(process, nodes, 12)
    output, took = end_of(process, lines, cut_at)
    assert process.returncode == 4, output[-3000:]
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
    # horovodrun says what it saw after that (rank 0 exited with 4), and
    # the launcher the line again, last.
    assert "Exit code: 4" in output.split(found[0])[1], output[-2000:]
    assert output.splitlines()[-1] == rank0[-1]
    assert_resumes(nodes, synthetic_cifar, log_root, found[3])


# Each rank's exit code to a file, as the batch scripts' TASK_SHELL keeps
# it: mpirun exits 1 for any failed rank, and only once it has heard from
# every node's daemon, which a cut link keeps it from (below).
RANK_SHELL = (
    'codes=$0; "$@"; code=$?; echo "$code" >"$codes/$OMPI_COMM_WORLD_RANK"; '
    'exit "$code"'
)


def wait_for_file(path, seconds):
    """Waits at most `seconds` for `path`; its text, or None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.5)
    return None


@pytest.fixture
def mpi_horovod():
    """Skips unless Horovod was built with MPI and Open MPI's mpirun is here."""
    import horovod.tensorflow as hvd  # Not on the newest set.

    if not shutil.which("mpirun"):
        pytest.skip("no mpirun (Open MPI)")
    if not hvd.mpi_built():
        pytest.skip("Horovod was built without MPI (no mpicxx at set-up)")


def start_mpirun(nodes, rank, synthetic_cifar, log_root):
    """Open MPI's mpirun on node1 as the docs say (`-H`), node2's daemon
    over the nodes' ssh: `rank` what precedes the Horovod rank's command
    (a shell that keeps its exit code)."""
    hosts = ",".join(f"{address}:1" for address in two_nodes.ADDRESSES.values())
    return start_on(
        nodes, "node1", "mpirun", "--allow-run-as-root", "-np", "2", "-H",
        hosts, "-bind-to", "none", "-x", "PATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
        "-mca", "btl", "tcp,self", "-mca", "btl_tcp_if_include", "eth0",
        "-mca", "oob_tcp_if_include", "eth0", *rank,
        sys.executable, WORKER, f"--dump_dir={log_root}_dump",
        "--distribution=horovod", *partition_flags(synthetic_cifar, log_root),
    )  # fmt: skip


@pytest.mark.slow
@on_two_nodes
@requires_horovod
def test_a_cut_link_ends_mpirun_ranks_within_the_bound(
    nodes, synthetic_cifar, tmp_path, mpi_horovod
):
    """Horovod on MPI has no timeout of its own: the watch ends the rank.

    After rank 0 exits 4, a plain mpirun waits for node2's daemon to
    acknowledge the abort, which the cut keeps from arriving (until TCP
    gives up: minutes); the batch scripts end it STEP_GRACE seconds after
    a rank's exit (LAUNCHER=mpirun), as here the test does.
    """
    log_root = tmp_path / "log"
    codes = tmp_path / "codes"
    codes.mkdir()
    rank = ("sh", "-c", RANK_SHELL, str(codes))
    process = start_mpirun(nodes, rank, synthetic_cifar, log_root)
    try:
        lines, cut_at = cut_after(process, nodes, 12)
        drain = threading.Thread(target=lines.extend, args=(process.stdout,))
        drain.start()
        code = wait_for_file(codes / "0", BOUND + 60)
        took = time.monotonic() - cut_at
    finally:
        nodes.end("node1")  # mpirun, node2's daemon and rank (its ssh's).
        process.wait()
    drain.join(30)
    output = "".join(lines)
    assert code == "4", f"rank 0: {code}\n{output[-3000:]}"
    assert took < BOUND + 30, f"{took:.0f} s\n{output[-3000:]}"
    found = re.search(LOST.format(peer=r"rank 1 on node2"), output)
    assert found, output[-3000:]
    assert f"--peer_timeout_secs={BOUND}" in found[2]
    assert int(found[1]) >= 12 and int(found[4]) >= 10, found[0]
    with two_nodes.Nodes() as again:
        assert_resumes(again, synthetic_cifar, log_root, found[3])


@pytest.mark.slow
@on_two_nodes
@requires_horovod
def test_the_launcher_ends_an_mpirun_run_cut_off_with_its_line(
    nodes, synthetic_cifar, tmp_path, mpi_horovod
):
    """Across hosts with mpirun, as docs/distributed.md tells a user to.

    The launcher sets Open MPI's keepalive from the bound, so mpirun
    declares node2's daemon lost before the ranks' bound and ends the
    job by itself (killing rank 0 before it can say its line); the
    launcher then says the lost-peer line last, naming node2 and the
    newest checkpoint, with exit 4, and the same command resumes.
    """
    log_root = tmp_path / "log"
    hosts = ",".join(f"{address}:1" for address in two_nodes.ADDRESSES.values())
    process = start_on(
        nodes, "node1", sys.executable, "-m", "tf_resnet.launch.horovod",
        "--np=2", f"--hosts={hosts}", "--network=host", "--launcher=mpirun",
        "--network_interface=eth0", f"--main={WORKER}", "--",
        f"--dump_dir={log_root}_dump", "--distribution=horovod",
        *partition_flags(synthetic_cifar, log_root),
        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_btl="tcp,self",
    )  # fmt: skip
    lines, cut_at = cut_after(process, nodes, 12)
    output, took = end_of(process, lines, cut_at)
    assert process.returncode == 4, output[-3000:]
    # Within the keepalive's half of the bound, and some slack for a
    # loaded machine: before the ranks' bound, so no rank said the line.
    assert took < BOUND + 10, f"{took:.0f} s\n{output[-3000:]}"
    assert "<stderr>:resnet_main: error: lost" not in output, output[-3000:]
    assert "ORTE has lost communication with a remote daemon" in output
    found = re.fullmatch(
        LOST.format(peer=r"the ranks on 10\.78\.0\.2") + r" \(exit code 4.*",
        output.splitlines()[-1],
    )
    assert found, output[-3000:]
    assert "mpirun lost its daemon on 10.78.0.2" in found[2]
    assert int(found[1]) >= 12 and int(found[4]) >= 10, found[0]
    assert found[3] == peer_watch.newest_checkpoint(str(log_root))
    assert_resumes(nodes, synthetic_cifar, log_root, found[3])


# TensorFlow's collectives' doing (on CI's newest set, as the helpers
# say of multi_worker scenarios); Horovod's runs on the pinned set.
@pytest.mark.slow
@on_two_nodes
@on_newest_set
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
        start_on(
            nodes,
            node,
            sys.executable,
            WORKER,
            f"--dump_dir={log_root}_dump",
            "--distribution=multi_worker",
            f"--worker_hosts={workers}",
            f"--task_index={index}",
            *partition_flags(synthetic_cifar, log_root),
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


# The watch itself (TensorFlow's coordinator waits for a worker it cannot
# reach, in a call that holds the GIL), once: on the pinned set's leg.
@pytest.mark.slow
@on_two_nodes
@on_one_set
def test_a_cut_link_ends_a_parameter_server_coordinator_within_the_bound(
    nodes, synthetic_cifar, tmp_path
):
    """The coordinator ends at its bound; the worker cut off from it too.

    The worker task only serves: with no data from the coordinator for
    the bound, its traffic watch ends it with the line and exit 4.
    """
    log_root = tmp_path / "log"
    cluster = ["--ps_hosts=10.78.0.1:24000", "--worker_hosts=10.78.0.2:24001"]
    task_flags = [f"--log_root={log_root}", f"--peer_timeout_secs={BOUND}"]
    ps = subprocess.Popen(
        [*nodes.enter("node1"), sys.executable, WORKER, "--job_name=ps",
         "--task_index=0", *cluster, *task_flags],
        env=nodes.env(), cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    worker = start_on(
        nodes, "node2", sys.executable, WORKER, "--job_name=worker",
        "--task_index=0", *cluster, *task_flags,
    )  # fmt: skip
    coordinator = start_on(
        nodes, "node1", sys.executable, WORKER, f"--dump_dir={log_root}_dump",
        "--distribution=parameter_server", *cluster,
        *partition_flags(synthetic_cifar, log_root),
    )  # fmt: skip
    try:
        lines, cut_at = cut_after(coordinator, nodes, 12)
        output, took = end_of(coordinator, lines, cut_at)
        served, worker_took = end_of(worker, [], cut_at)
    finally:
        for task in (ps, worker, coordinator):
            task.kill()
            task.wait()
    assert coordinator.returncode == 4, output[-3000:]
    assert took < BOUND + 30, f"{took:.0f} s\n{output[-3000:]}"
    last = output.strip().splitlines()[-1]
    peers = r"ps 0 on 10\.78\.0\.1:24000, worker 0 on 10\.78\.0\.2:24001"
    found = re.match(LOST.format(peer=peers), last)
    assert found, output[-3000:]
    assert f"--peer_timeout_secs={BOUND}" in found[2]
    assert int(found[1]) >= 12 and int(found[4]) >= 10, found[0]
    # The worker: its own bound after the last data it received.
    assert worker.returncode == 4, served[-3000:]
    assert worker_took < BOUND + 30, f"{worker_took:.0f} s\n{served[-3000:]}"
    worker_line = served.strip().splitlines()[-1]
    assert worker_line.startswith(
        "resnet_main: error: lost a task of the training cluster (no data "
        "from the coordinator or another task for --peer_timeout_secs="
        f"{BOUND} s: a peer is gone, cut off or frozen; waiting on the "
        f"coordinator); the newest complete checkpoint is {log_root}/ckpt-"
    ), served[-3000:]
    assert_resumes(nodes, synthetic_cifar, log_root, found[3])

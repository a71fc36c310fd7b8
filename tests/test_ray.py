"""`tf_resnet.launch.ray` on a real two-node Ray cluster, in private.

The cluster: two network namespaces joined by a veth pair (10.77.0.1, the
head, and 10.77.0.2) and no other device but their loopbacks, so nothing
the cluster opens is reachable from outside and nothing it sends leaves.
Each namespace also has its own PID namespace: `ray stop --force` inside
sees only that node's processes, and killing the namespace's first process
ends every process Ray started there, whatever happens to the test. The
launcher runs in the head's namespaces, as a user's driver on the head.

The workers run `tests/hvd_worker.py` (resnet_main with small models and
dumps of each worker's weights), as in tests/test_multi_worker.py. Each
node offers 2 CPUs and the runs spread their 2 workers over the 2 nodes,
so two runs train side by side.

Only requirements-latest.txt has Ray: the cluster tests skip elsewhere.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests import engine_runs, ray_cluster
from tests.engine_runs import Spec, dumped_weights
from tests.helpers import ROOT
from tests.ray_cluster import (
    HEAD,
    NODE,
    ray_resnet8_flags,
    read,
    requires_ray,
)
from tf_resnet.launch import ray as launcher

WORKER = engine_runs.WORKER


def finish(started, timeout=300):
    """Waits for a launcher; returns `(exit code, output)`."""
    process, output = started
    try:
        code = process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with open(output) as stream:
        return code, stream.read()


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster.running() as started:
        yield started


@pytest.fixture(scope="module")
def equivalence(cluster, tmp_path_factory):
    """Side by side: Ray multi_worker, Ray averaging, and one process."""
    root = tmp_path_factory.mktemp("ray_equivalence")
    single = engine_runs.start_worker(Spec("default", learning_rate=0.4).args())
    runs = {
        name: cluster.launch(
            [*spec.args(), f"--log_root={root / name / 'log'}"], root / name
        )
        for name, spec in (
            ("multi_worker", Spec("multi_worker", learning_rate=0.4)),
            (
                "averaging",
                Spec(
                    "averaging", learning_rate=0.8, extra=("--average_every=1",)
                ),
            ),
        )
    }
    results = {name: finish(started) for name, started in runs.items()}
    return root, results, single.result().check()


@pytest.mark.cluster
@pytest.mark.slow
@requires_ray
def test_on_two_nodes_workers_equal_one_process_and_averaging_sync_sgd(
    equivalence,
):
    """One test, so that pytest-xdist runs these runs once, side by side."""
    check_multi_worker_equals_one_process(*equivalence)
    check_averaging_every_step_equals_synchronous_sgd(*equivalence)


def check_multi_worker_equals_one_process(root, results, single):
    code, output = results["multi_worker"]
    assert code == 0, output[-5000:]
    # Ray Train put one worker on each node (either rank on either one).
    placed = re.findall(r"\(ip=(\S+), pid=\d+\) world_rank=\d", output)
    assert sorted(placed) == [HEAD, NODE], output[-5000:]
    assert "global batch 16 over 2 replica(s) (multi_worker)" in output
    worker0 = dumped_weights(root / "multi_worker", 0)
    worker1 = dumped_weights(root / "multi_worker", 1)
    for ours, theirs in zip(worker0, worker1, strict=True):
        assert (ours == theirs).all()
    engine_runs.assert_same_weights(
        worker0, single.weights(), single.weights(name="first")
    )


def check_averaging_every_step_equals_synchronous_sgd(root, results, single):
    code, output = results["averaging"]
    assert code == 0, output[-5000:]
    assert "over 2 replica(s) (averaging)" in output
    for rank in (0, 1):
        engine_runs.assert_same_weights(
            dumped_weights(root / "averaging", rank),
            single.weights(),
            single.weights(name="first"),
        )
        slots = dumped_weights(root / "averaging", rank, "optimizer")
        expected = single.weights(name="optimizer")
        assert len(slots) == len(expected) > 1
        assert slots[0] == expected[0]  # The step counter.
        scale = max(float(abs(e).max()) for e in expected[1:])
        for value, reference in zip(slots[1:], expected[1:], strict=True):
            assert abs(value - reference).max() <= 1e-4 * scale


def kill_actor(dump_dir, rank):
    """SIGKILLs the Ray actor of worker `rank`; returns its host pid.

    The worker's resnet_main wrote its pid as its PID namespace sees it;
    the host's /proc names both (`NSpid`), and its parent is the actor.
    """
    ns_pid = int(read(os.path.join(dump_dir, f"pid_rank{rank}.txt")))
    for entry in filter(str.isdigit, os.listdir("/proc")):
        status = read(f"/proc/{entry}/status")
        nspid = re.search(r"^NSpid:\s+(.*)$", status, re.M)
        if not nspid or nspid[1].split()[-1] != str(ns_pid):
            continue
        if str(dump_dir) not in read(f"/proc/{entry}/cmdline"):
            continue
        actor = int(re.search(r"^PPid:\s+(\d+)", status, re.M)[1])
        if "RayTrainWorker" not in read(f"/proc/{actor}/cmdline"):
            continue
        os.kill(actor, signal.SIGKILL)
        return actor
    raise AssertionError(f"no process of worker {rank} (pid {ns_pid})")


def wait_for(predicate, timeout=240):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


STEPS = 30


@pytest.mark.cluster
@pytest.mark.slow
@requires_ray
def test_killed_actors_and_a_failed_resnet_main(
    cluster, synthetic_cifar, tmp_path
):
    """Side by side: a killed actor with one restart left, and with none;
    then a resnet_main that fails. One test, for pytest-xdist."""
    root = tmp_path
    resumed = cluster.launch(
        ray_resnet8_flags(
            synthetic_cifar, root / "resumed" / "log",
            f"--train_steps={STEPS}", "--checkpoint_every_steps=5",
            "--eval_every_steps=1000",
        ),
        root / "resumed",
        "--max_failures=1",
    )  # fmt: skip
    stopped = cluster.launch(
        ray_resnet8_flags(
            synthetic_cifar, root / "stopped" / "log", "--train_steps=100000"
        ),
        root / "stopped",
        "--max_failures=0",
    )
    try:
        # One restart: killed once the chief wrote its first checkpoint,
        # first, while the run of STEPS steps is still short of its end.
        wait_for(lambda: read(root / "resumed" / "saves_rank0.txt"))
        kill_actor(root / "resumed", 1)
        # No restart left: killed after its first step (it runs for good).
        wait_for(lambda: read(root / "stopped" / "pid_rank1.txt"))
        kill_actor(root / "stopped", 1)
    except BaseException:
        for process, _ in (resumed, stopped):
            os.killpg(process.pid, signal.SIGKILL)
        raise
    check_no_restart_left_ends_the_run_with_advice(*finish(stopped))
    # In the CPUs the stopped run left, while the other one trains on.
    failed = cluster.launch(
        ["--train_data_path=/nonexistent/data_batch*",
         "--eval_data_path=/nonexistent/test_batch.bin",
         f"--log_root={root / 'failed' / 'log'}"],
        root / "failed",
        "--max_failures=2",
    )  # fmt: skip
    try:
        check_the_workers_restart_from_the_last_checkpoint(
            root, *finish(resumed)
        )
    finally:
        code, output = finish(failed)
    check_a_failed_resnet_main_is_not_restarted(code, output)


def check_the_workers_restart_from_the_last_checkpoint(root, code, output):
    assert code == 0, output[-5000:]
    assert "launch.ray: starting 2 worker(s) (restart 1 of 1)" in output
    resumed = re.findall(r"resumed from \S+ckpt-(\d+) at step (\d+)\b", output)
    # Both workers of the second attempt, from the same checkpoint.
    assert len(resumed) == 2 and len(set(resumed)) == 1, output[-5000:]
    step = int(resumed[0][1])
    assert resumed[0][0] == str(step) and step >= 5
    assert step < STEPS, f"the kill came after the last step\n{output[-5000:]}"
    saves = [
        int(line.rsplit("-", 1)[1])
        for line in read(root / "resumed" / "saves_rank0.txt").split()
    ]
    # Nothing lost beyond the last checkpoint: the restart took the newest
    # one, so no checkpoint step was trained and written twice.
    assert saves == sorted(set(saves)), saves
    assert step in saves and saves[-1] == STEPS, saves
    # The second attempt's workers end equal, BatchNorm statistics too.
    worker0 = dumped_weights(root / "resumed", 0)
    worker1 = dumped_weights(root / "resumed", 1)
    assert len(worker0) > 30  # Kernels, BN scale/offset/mean/variance.
    for ours, theirs in zip(worker0, worker1, strict=True):
        assert (ours == theirs).all()


def check_no_restart_left_ends_the_run_with_advice(code, output):
    assert code != 0, output[-5000:]
    assert "no restart is left (--max_failures=0)" in output, output[-5000:]
    assert "worker 1: its actor or its node is gone" in output
    assert "rerun the same command to resume" in output
    assert "(restart 1 of" not in output


def check_a_failed_resnet_main_is_not_restarted(code, output):
    assert code == 2, output[-5000:]
    # Both workers read the missing files; which failure Ray reports first
    # is a race.
    assert re.search(r"worker \d: resnet_main exited with code 2", output), (
        output[-5000:]
    )
    assert "a restart would fail the same way" in output
    assert "(restart 1 of" not in output


# Without a cluster: the command line, and an environment without Ray.


def test_launcher_flags_and_the_original_spelling():
    args = launcher.parse_args(
        ["--redis-address=head:6379", "--num_workers=4", "--", "--model=x"]
    )
    assert (args.address, args.num_workers, args.max_failures) == (
        "head:6379",
        4,
        3,
    )
    assert (args.gpus_per_worker, args.cpus_per_worker) == (0, 1)
    assert launcher.parse_args(["--num_workers=1", "--"]).address == "auto"
    assert launcher.worker_command("main.py", ["--model=x"]) == [
        "main.py",
        "--model=x",
        "--distribution=multi_worker",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_workers=2", "--", "--distribution=horovod"],
         "--distribution=horovod: Ray's workers form a TF_CONFIG cluster"),
        (["--num_workers=2", "--", "--distribution", "parameter_server"],
         "--distribution=parameter_server: Ray's workers"),
        (["--num_workers=0", "--"], "--num_workers must be at least 1"),
        (["--num_workers=2", "--max_failures=-1", "--"],
         "--max_failures must be at least 0"),
        (["--num_workers=2", "--", "--peer_timeout_secs=0"],
         "--peer_timeout_secs must be positive, got 0.0"),
        (["--num_workers=2"], "no --"),
    ],
)  # fmt: skip
def test_launcher_refuses_what_its_workers_cannot_run(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        launcher.parse_args(argv)
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("launch.ray: error: ") and message in error
    assert error.count("\n") == 1


def test_failures_name_each_worker_and_the_exit_code():
    class Wrapped(Exception):  # As Ray Train returns a worker's error.
        def __init__(self, base):
            super().__init__(str(base))
            self._base_exc = base

    class Failed(Exception):
        worker_failures = {
            1: Wrapped(
                launcher.WorkerExit("resnet_main exited with code 4", 4)
            ),
            0: RuntimeError("The actor died unexpectedly\nmore"),
        }

    found = launcher.failures(Failed())
    assert found == [
        (
            0,
            None,
            "its actor or its node is gone (The actor died unexpectedly)",
        ),
        (1, 4, "resnet_main exited with code 4"),
    ]
    # 4 is what the survivors of a lost peer exit with: the cause wins.
    assert launcher.exit_code_of(found) == 4
    assert launcher.exit_code_of([(0, 4, ""), (1, 137, "")]) == 137
    assert launcher.exit_code_of([(0, None, "")]) == 1
    # A retry that cannot start its workers after a lost peer ends the
    # run (with 4); any worker's own code, or no lost peer before, not.
    gone = [(None, None, "the worker group startup timed out")]
    assert launcher.could_not_restart(gone, lost_a_peer=True)
    assert not launcher.could_not_restart(gone, lost_a_peer=False)
    assert not launcher.could_not_restart([(0, 137, "")], lost_a_peer=True)
    assert not launcher.could_not_restart([(0, 1, "")], lost_a_peer=True)


def test_ray_train_waits_on_a_node_no_longer_than_the_bound():
    start, health = "START_TIMEOUT_S", "HEALTH_CHECK_TIMEOUT_S"
    defaults = {start: 60.0, health: 600.0}
    assert launcher.bounded_waits(30.0, {}, defaults) == {
        start: 30.0,
        health: 30.0,
    }
    # Ray's default when it is the shorter; the user's value always.
    assert launcher.bounded_waits(300.0, {}, defaults) == {health: 300.0}
    assert launcher.bounded_waits(30.0, {start: "90"}, defaults) == {
        health: 30.0
    }
    assert launcher.bounded_waits(900.0, {}, defaults) == {}


@requires_ray
def test_the_bound_after_dashes_sets_ray_trains_timeouts(monkeypatch, capsys):
    start = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
    health = "RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S"
    monkeypatch.delenv(start, raising=False)
    monkeypatch.setenv(health, "45")
    launcher.bound_ray_train(["--model=x", "--peer_timeout_secs=30"])
    assert (os.environ[start], os.environ[health]) == ("30", "45")
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"launch.ray: {start}=30 (Ray Train's default 60): no wait on a "
        "node outlasts --peer_timeout_secs=30; set the variable to choose "
        "another"
    ]
    # resnet_main's default bound (300 s) leaves Ray's 60 s start timeout.
    monkeypatch.delenv(start)
    monkeypatch.delenv(health)
    launcher.bound_ray_train(["--model=x"])
    assert start not in os.environ and os.environ[health] == "300"


def test_launcher_imports_neither_ray_nor_tensorflow():
    report = subprocess.run(
        [sys.executable, "-c",
         "import json, sys; before = set(sys.modules); "
         "import tf_resnet.launch.ray; "
         "added = {n.split('.')[0] for n in set(sys.modules) - before}; "
         "print(json.dumps(sorted(added - set(sys.stdlib_module_names))))"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert report.strip() == '["absl", "tf_resnet"]'


def test_without_ray_one_error_names_the_requirement_set():
    # Ray hidden as where it is not installed (requirements.txt).
    code = (
        "import sys; sys.modules['ray'] = None; "
        "from tf_resnet.launch import ray; "
        "sys.exit(ray.main(['--num_workers=2', '--', '--model=x']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("launch.ray: error: ")
    assert "TF_RESNET_REQUIREMENTS=requirements-latest.txt" in lines[0]


@requires_ray
def test_no_cluster_at_the_address_is_one_error_within_a_minute(tmp_path):
    with socket.socket() as probe:  # A port nothing listens on.
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tf_resnet.launch.ray", f"--address={address}",
         "--num_workers=1", "--", f"--log_root={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert time.monotonic() - started < 60, result.stderr
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"launch.ray: error: no Ray cluster at --address={address}"
    )
    assert "ray start --head" in last and "Connection refused" in last

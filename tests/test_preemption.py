"""Stop signals on several processes: one step, one checkpoint, then resume.

Slurm preempts or requeues a job by sending SIGTERM to every process of it
at about the same time. Each process agrees with its peers, at steps all of
them know, whether any got one (`Distributor.any_process_stopping`),
so all stop at one step, the chief writes that step's checkpoint, and all
exit with the stop signal's code; a rerun resumes there.

The multi_worker runs start their two workers themselves (in a
loopback-only network namespace, as `tf_resnet.launch.tf_config_cluster` does)
to see each worker's exit code and log apart. The runs of one test start
side by side: the CI machine has 2 cores, and start-up is most of a run.
They run once: the Horovod ones on the pinned set (`on_one_set`), the
multi_worker ones on the newest (`on_newest_set`, for CI's budget).
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests import engine_runs
from tests.helpers import (
    ROOT,
    on_newest_set,
    requires_horovod,
    resnet8_flags,
)

WORKER = engine_runs.WORKER
STEPS = 60
FIRST_CHECKPOINT = 4
STOPPED = r"stopped: (SIGTERM|stop requested by another process) at step (\d+)"

CLUSTER = """
import json, os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from tf_resnet.launch import private_network, tf_config_cluster
private_network.enter_private_network()
spec = json.loads(sys.argv[2])
main = os.path.join(sys.argv[1], "tests", "hvd_worker.py")
commands = tf_config_cluster.worker_commands(main, spec["flags"], 2)
workers = []
for index, (command, env) in enumerate(commands.values()):
    with open(os.path.join(spec["out"], f"worker{index}.txt"), "w") as out:
        workers.append(subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT
        ))
if spec["signal"]:
    deadline = time.monotonic() + 600
    while not os.path.exists(spec["wait_for"]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for index in spec["signal"]:
        workers[index].send_signal(signal.SIGTERM)
codes = []
for worker in workers:
    try:
        codes.append(worker.wait(timeout=900))
    except subprocess.TimeoutExpired:
        worker.kill()
        codes.append(None)
print(json.dumps(codes))
"""


def private_tmp(folder):
    """The workers' environment, with a temporary directory of the test's.

    A worker killed while it saves leaves its scratch checkpoint directory
    behind (`checkpoint_dir`); other tests look for leftovers in /tmp.
    """
    tmp = pathlib.Path(folder) / "tmp"
    tmp.mkdir(exist_ok=True)
    return engine_runs.worker_env(TMPDIR=str(tmp))


def train_flags(synthetic_cifar, log_root, dump_dir):
    """ResNet-8 (BatchNorm), a checkpoint every 4 steps, deterministic."""
    return resnet8_flags(
        synthetic_cifar,
        log_root,
        f"--dump_dir={dump_dir}",
        f"--train_steps={STEPS}",
        f"--checkpoint_every_steps={FIRST_CHECKPOINT}",
        "--eval_every_steps=1000",
        "--eval_batch_count=1",
        "--log_every_steps=4",
        "--dtype=float32",
        "--deterministic",
    )


class Cluster:
    """Two multi_worker workers of `train_flags`, started by CLUSTER."""

    def __init__(self, synthetic_cifar, folder, name):
        self.folder = pathlib.Path(folder) / name
        self.log_root = self.folder / "log"
        self.dump_dir = self.folder / "dump"
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        self.flags = train_flags(synthetic_cifar, self.log_root, self.dump_dir)

    def start(self, out_name, signal_workers=()):
        """Starts the workers; `finish` waits for them."""
        out = self.folder / out_name
        out.mkdir()
        spec = {
            "flags": self.flags,
            "out": str(out),
            "signal": list(signal_workers),
            "wait_for": str(self.log_root / f"ckpt-{FIRST_CHECKPOINT}.index"),
        }
        self.out = out
        self.process = subprocess.Popen(
            [
                sys.executable, "-c", textwrap.dedent(CLUSTER), ROOT,
                json.dumps(spec),
            ],
            cwd=ROOT, env=private_tmp(self.folder), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        return self

    def finish(self):
        """`(exit codes of the two workers, their logs)`."""
        stdout, stderr = self.process.communicate(timeout=900)
        assert self.process.returncode == 0, stderr[-3000:]
        codes = json.loads(stdout.strip().splitlines()[-1])
        logs = [(self.out / f"worker{i}.txt").read_text() for i in (0, 1)]
        return codes, logs

    def weights(self, rank):
        return engine_runs.dumped_weights(self.dump_dir, rank)


def stop_of(log):
    """`(reason, step)` of the worker's stop line."""
    stopped = re.search(STOPPED, log)
    assert stopped, log[-3000:]
    return stopped[1], int(stopped[2])


def checkpoints_written(log_root, dump_dir):
    """Each rank's saved checkpoints (`hvd_worker.py`; None: it saved none),
    and the checkpoints in `log_root`, by name."""
    saves = [
        path.read_text().split() if path.exists() else None
        for path in (
            pathlib.Path(dump_dir, f"saves_rank{r}.txt") for r in (0, 1)
        )
    ]
    return saves, sorted(path.stem for path in log_root.glob("ckpt-*.index"))


def assert_one_checkpoint_of_step(log_root, written, step):
    """The chief saved `step`'s checkpoint once, last; no other saved one."""
    saves, in_log_root = written
    path = str(log_root / f"ckpt-{step}")
    assert saves[0].count(path) == 1 and saves[0][-1] == path, saves
    assert saves[1] is None
    assert f"ckpt-{step}" in in_log_root


def assert_like_uninterrupted(weights, reference):
    """Resumed = uninterrupted: kernels bit-equal, the rest to 1e-4.

    The workers' BN moving statistics are averaged at every checkpoint, so
    the stop's extra one rounds them once more (measured: 2.4e-7 at most).
    """
    assert len(weights) == len(reference) > 30
    for ours, theirs in zip(weights, reference, strict=True):
        if ours.ndim > 1:
            np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def multi_worker_runs(synthetic_cifar, tmp_path_factory):
    """Uninterrupted, SIGTERM to worker 1, to both, SIGKILL under the
    launcher; then the reruns of the first and the last. Side by side.

    Only one of the two stops is rerun: resuming from the stop's
    checkpoint is the same either way, and a rerun is a start-up of
    TensorFlow on each worker, most of a run's time here.
    """
    folder = tmp_path_factory.mktemp("preemption")
    reference = Cluster(synthetic_cifar, folder, "reference").start("run")
    one = Cluster(synthetic_cifar, folder, "one").start("first", [1])
    both = Cluster(synthetic_cifar, folder, "both").start("first", [0, 1])
    killed = Killed(synthetic_cifar, folder)
    first = {
        "killed": killed.kill_worker_1(),
        "one": one.finish(),
        "both": both.finish(),
    }
    written = {
        name: checkpoints_written(cluster.log_root, cluster.dump_dir)
        for name, cluster in (("one", one), ("both", both))
    }
    one.start("rerun")
    killed.rerun_start()
    rerun = {"one": one.finish(), "killed": killed.rerun_finish()}
    reference_codes, _ = reference.finish()
    assert reference_codes == [0, 0]
    return {
        "reference": reference.weights(0),
        "clusters": {"one": one, "both": both, "killed": killed},
        "first": first,
        "written": written,
        "rerun": rerun,
    }


@pytest.mark.slow
@on_newest_set
@pytest.mark.parametrize("signalled", ["one", "both"])
def test_multi_worker_stops_at_one_step_and_resumes(
    multi_worker_runs, signalled
):
    cluster = multi_worker_runs["clusters"][signalled]
    codes, logs = multi_worker_runs["first"][signalled]
    # Both exit with the code of SIGTERM, not killed by it.
    assert codes == [128 + signal.SIGTERM] * 2, logs[0][-2000:]
    (reason0, step), (reason1, step1) = stop_of(logs[0]), stop_of(logs[1])
    assert step == step1
    assert FIRST_CHECKPOINT <= step <= STEPS
    if signalled == "one":
        assert (reason0, reason1) == (
            "stop requested by another process",
            "SIGTERM",
        )
    else:
        assert reason0 == reason1 == "SIGTERM"
    assert f"checkpoint written to {cluster.log_root}/ckpt-{step}" in logs[0]
    assert "checkpoint written by the chief" in logs[1]
    assert_one_checkpoint_of_step(
        cluster.log_root, multi_worker_runs["written"][signalled], step
    )
    if signalled == "both":
        return
    codes, logs = multi_worker_runs["rerun"][signalled]
    assert codes == [0, 0], logs[0][-2000:]
    for log in logs:
        resumed = f"resumed from {cluster.log_root}/ckpt-{step} at step {step}"
        assert resumed in log, log[-2000:]
    worker0, worker1 = cluster.weights(0), cluster.weights(1)
    for ours, theirs in zip(worker0, worker1, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert_like_uninterrupted(worker0, multi_worker_runs["reference"])


class Killed:
    """The multi_worker launcher, worker 1 SIGKILLed after a checkpoint."""

    def __init__(self, synthetic_cifar, folder):
        self.folder = pathlib.Path(folder) / "killed"
        self.log_root = self.folder / "log"
        self.dump_dir = self.folder / "dump"
        self.dump_dir.mkdir(parents=True)
        self.command = [
            sys.executable, "-m", "tf_resnet.launch.tf_config_cluster",
            "--np=2",
            f"--main={WORKER}", "--",
            *train_flags(synthetic_cifar, self.log_root, self.dump_dir),
        ]  # fmt: skip
        self.runs = []
        self.process = self._start()

    def _start(self):
        # To a file: a pipe nobody reads while training would fill up.
        self.output = self.folder / f"output{len(self.runs)}.txt"
        self.runs.append(self.output)
        with open(self.output, "w") as out:
            return subprocess.Popen(
                self.command, cwd=ROOT, env=private_tmp(self.folder),
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def _finish(self, timeout):
        self.process.wait(timeout=timeout)
        return self.process.returncode, self.output.read_text()

    def kill_worker_1(self):
        """`(launcher's exit code, output, latest checkpoint step)`."""
        pid_file = self.dump_dir / "pid_rank1.txt"
        checkpoint = self.log_root / f"ckpt-{FIRST_CHECKPOINT}.index"
        deadline = time.monotonic() + 600
        while not (pid_file.exists() and checkpoint.exists()):
            assert time.monotonic() < deadline, "no checkpoint in 600 s"
            assert self.process.poll() is None, self.output.read_text()
            time.sleep(0.05)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        code, output = self._finish(timeout=300)
        latest = max(
            int(path.name[len("ckpt-") : -len(".index")])
            for path in self.log_root.glob("ckpt-*.index")
        )
        return code, output, latest

    def rerun_start(self):
        self.process = self._start()

    def rerun_finish(self):
        return self._finish(timeout=900)

    def weights(self, rank):
        return engine_runs.dumped_weights(self.dump_dir, rank)


@pytest.mark.slow
@on_newest_set
def test_the_launcher_names_a_killed_worker_and_a_rerun_resumes(
    multi_worker_runs,
):
    killed = multi_worker_runs["clusters"]["killed"]
    code, output, latest = multi_worker_runs["first"]["killed"]
    assert code == 128 + signal.SIGKILL, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert re.fullmatch(
        r"launch\.tf_config_cluster: worker 1 at \S+ exited with code 137 "
        r"\(SIGKILL\): rerun the same command to resume from the latest "
        rf"checkpoint in --log_root={killed.log_root} \(or from the start if "
        r"there is none\)",
        last,
    ), last
    code, output = multi_worker_runs["rerun"]["killed"]
    assert code == 0, output[-3000:]
    resumed = f"resumed from {killed.log_root}/ckpt-{latest} at step {latest}"
    assert output.count(resumed) == 2, output[-3000:]
    assert_like_uninterrupted(killed.weights(0), multi_worker_runs["reference"])


def horovod_flags(synthetic_cifar, log_root):
    """`train_flags` on Horovod; `start_worker` gives the dump directory."""
    flags = train_flags(synthetic_cifar, log_root, "unused")
    flags = [flag for flag in flags if not flag.startswith("--dump_dir=")]
    return [*flags, "--distribution=horovod"]


def rank_lines(output, rank):
    return "\n".join(
        line for line in output.splitlines() if line.startswith(f"[{rank}]<")
    )


def sigterm_ranks(runs):
    """SIGTERM to the given ranks of each run, as soon as both of its ranks
    trained a step and its first checkpoint exists; all polled at once.

    Args:
      runs: `[(started run, its log_root, ranks to signal)]`.
    """
    waiting = list(runs)
    deadline = time.monotonic() + 600
    while waiting:
        for run in list(waiting):
            started, log_root, ranks = run
            pids = [
                pathlib.Path(started.dump_dir, f"pid_rank{r}.txt")
                for r in (0, 1)
            ]
            checkpoint = log_root / f"ckpt-{FIRST_CHECKPOINT}.index"
            if all(path.exists() for path in pids) and checkpoint.exists():
                for rank in ranks:
                    os.kill(int(pids[rank].read_text()), signal.SIGTERM)
                waiting.remove(run)
            elif started.process.poll() is not None:
                output = pathlib.Path(started.output_path).read_text()
                pytest.fail(f"ended before the signal:\n{output[-3000:]}")
        assert time.monotonic() < deadline, "no checkpoint in 600 s"
        time.sleep(0.05)


# Three jobs start side by side on 2 cores: Gloo's 30 s default bounds how
# far apart two ranks may reach `hvd.init()`.
SLOW_START = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "120"}


@pytest.mark.slow
@requires_horovod
def test_horovod_ranks_stop_at_one_step_and_resume(synthetic_cifar, tmp_path):
    """SIGTERM to rank 1 alone, and to both ranks, of two Horovod runs; the
    first is rerun (as for multi_worker, one rerun covers the resume)."""
    log_roots = {name: tmp_path / name for name in ("reference", "one", "both")}
    started = {
        name: engine_runs.start_worker(
            horovod_flags(synthetic_cifar, log_root), ranks=2, **SLOW_START
        )
        for name, log_root in log_roots.items()
    }
    sigterm_ranks(
        [
            (started[name], log_roots[name], ranks)
            for name, ranks in (("one", [1]), ("both", [0, 1]))
        ]
    )
    results = {name: run.result(timeout=900) for name, run in started.items()}
    reference = results.pop("reference").check()
    steps = {}
    for name, run in results.items():
        assert run.returncode != 0, run.output[-3000:]
        (reason0, step), (reason1, step1) = (
            stop_of(rank_lines(run.output, rank)) for rank in (0, 1)
        )
        assert step == step1 and FIRST_CHECKPOINT <= step <= STEPS
        if name == "one":
            assert reason0 == "stop requested by another process"
        else:
            assert reason0 == "SIGTERM"
        assert reason1 == "SIGTERM"
        # horovodrun names the first rank to exit non-zero (and ends the
        # other, which is leaving too).
        assert re.search(r"Process [01] exit with status code 143", run.output)
        assert_one_checkpoint_of_step(
            log_roots[name],
            checkpoints_written(log_roots[name], run.dump_dir),
            step,
        )
        steps[name] = step
    rerun = engine_runs.start_worker(
        horovod_flags(synthetic_cifar, log_roots["one"]), ranks=2, **SLOW_START
    ).result(timeout=900)
    rerun.check()
    resumed = (
        f"resumed from {log_roots['one']}/ckpt-{steps['one']} at step "
        f"{steps['one']}"
    )
    for rank in (0, 1):
        assert resumed in rank_lines(rerun.output, rank), rerun.output[-3000:]
    for ours, theirs in zip(rerun.weights(0), rerun.weights(1), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert_like_uninterrupted(rerun.weights(0), reference.weights(0))

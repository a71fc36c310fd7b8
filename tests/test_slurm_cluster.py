"""The batch scripts and the engines on a real Slurm with two nodes.

`tests/slurm_cluster.py` starts Debian's Slurm (slurmctld, two slurmd) and
an sshd per node, each node in network and UTS namespaces of its own on a
private bridge: jobs are queued, placed and signalled by Slurm itself, and
the processes of a job talk over the bridge, not loopback. Needs root and
the packages `./setup.sh test` installs; skipped otherwise.

* `scontrol requeue` in the middle of a job: its processes stop at one
  step, the requeued job resumes by itself and ends with the weights of an
  uninterrupted run.
* Every Slurm script in scripts/ is submitted with sbatch as the docs tell
  a user, small by the environment variables the scripts read; each ends
  COMPLETED in Slurm's job completion log and leaves its learning curve,
  and the multi-process jobs put their processes on both nodes. The
  course's multi-node scripts are submitted by a plain user instead
  (`tests/test_cluster_user.py`, on this cluster).
* Workers on both nodes train as the loopback tests' standard asks: the
  same weights and BatchNorm statistics on every worker, equal to one
  process to 1e-4 (multi_worker under srun, averaging every step,
  Horovod ranks started over ssh, a parameter server on the other node).
* A job whose processes are killed, submitted again, loses only the steps
  since its last checkpoint; a frozen worker on the other node ends its
  job; a job that this Slurm requeues without its GPUs (after a node was
  lost) requeues itself again and completes.
"""

import csv
import glob
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import engine_runs
from tests.data_files import batch_job_data
from tests.engine_runs import dumped_weights
from tests.helpers import (
    ROOT,
    assert_resumed_like_uninterrupted,
    requires_horovod,
)
from tests.slurm_cluster import (
    JOB_TIMEOUT,
    NODES,
    REQUEUE_FLAGS,
    SMALL,
    SlurmCluster,
    missing_programs,
    output_of,
    wait_for_output,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Slurm grants the scripts' GPU requests from GPUs it believes in; none is
# real, and a single-node job asked for --num_gpus=N stops with an error
# when TensorFlow sees fewer: here the CPU is the device.
CPU = "--num_gpus=0"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the Slurm cluster needs root (namespaces, daemons)")
    missing = missing_programs()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (./setup.sh test)")
    slurm = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    slurm.start()
    try:
        yield slurm
    finally:
        slurm.stop()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return batch_job_data(tmp_path_factory.mktemp("data"))


# Preemption -----------------------------------------------------------------

# The requeue tests come first, as the longest: pytest-xdist's worksteal
# gives each worker a contiguous half of the file, and the long tests at
# its head leave short ones for the other worker to steal at the end.
# Each engine's job, requeued by hand (`scontrol requeue`: SIGTERM to every
# process) and, where the script's shell handles it apart, by the time
# limit's warning (#SBATCH --signal=B:USR1@300), which the job answers by
# requeueing itself. Both requeued jobs run beside one job never stopped,
# whose final weights they must end with.
REQUEUE_JOBS = {
    "multi_worker": (
        "slurm/course_sync_cifar100.sbatch",
        {"ENGINE": "multi_worker"},
        ("requeue", "time_limit"),
    ),
    "horovod": (
        "slurm/course_sync_cifar100.sbatch",
        {"HOROVOD_FLAGS": "--network-interface eth0"},
        ("requeue",),
    ),
    "parameter_server": (
        "slurm/course_async_cifar100.sbatch",
        {},
        ("requeue", "time_limit"),
    ),
}


def submit_small(cluster, data, home, script, env):
    """`script` with one task slot per node and REQUEUE_FLAGS; the job id."""
    env = {
        "TRAIN_DATA": data["TRAIN_DATA"], "EVAL_DATA": data["EVAL_DATA"],
        "HOME": str(home), "REPO": ROOT, "EXTRA_FLAGS": REQUEUE_FLAGS, **env,
    }  # fmt: skip
    path = os.path.join(ROOT, "scripts", script)
    return cluster.sbatch(path, home, env, ("--ntasks-per-node=1",))


@pytest.mark.parametrize("engine", REQUEUE_JOBS)
def test_a_requeued_job_stops_at_one_step_and_resumes_by_itself(
    cluster, data, tmp_path, engine
):
    if engine == "horovod" and requires_horovod.args[0]:
        pytest.skip("needs Horovod (the pinned requirement set)")
    script, env, triggers = REQUEUE_JOBS[engine]
    homes = {name: tmp_path / name for name in ("straight", *triggers)}
    jobs = {}
    for name, home in homes.items():
        home.mkdir()
        jobs[name] = submit_small(cluster, data, home, script, env)
    for trigger in triggers:
        # After the first periodic checkpoint: the stop's is a later one.
        wait_for_output(homes[trigger], r"step 13/60")
        if trigger == "time_limit":
            cluster.run(["scancel", "--batch", "--signal=USR1", jobs[trigger]])
        else:
            cluster.run(["scontrol", "requeue", jobs[trigger]])
    for name, job in jobs.items():
        record = cluster.wait(job, JOB_TIMEOUT)
        assert record["JobState"] == "COMPLETED", output_of(homes[name])[-5000:]
    (reference,) = glob.glob(os.path.join(homes["straight"], "runs", "*"))
    for trigger in triggers:
        check_requeued(cluster, engine, trigger, jobs[trigger], homes[trigger])
        # The same run directory both times (the job id is kept), and the
        # final weights of a run that was never stopped.
        (run,) = glob.glob(os.path.join(homes[trigger], "runs", "*"))
        assert_resumed_like_uninterrupted(run, reference, f"{trigger}: ")


def check_requeued(cluster, engine, trigger, job, home):
    """The job restarted once; every training process stopped at one
    step, and the job's second start resumed there, in every process."""
    assert cluster.job(job)["Restarts"] == "1", trigger
    text = output_of(home)
    if trigger == "time_limit":
        assert "the time limit is near: checkpointing" in text, text[-5000:]
        assert f"requeueing job {job}" in text, text[-5000:]
    stops = re.findall(r"resnet_main: stopped: .* at step (\d+)", text)
    processes = 1 if engine == "parameter_server" else 2
    # horovodrun ends the ssh session of the rank on node2 on SIGTERM, so
    # that rank's last lines are lost; it stops with the others all the
    # same (it resumes from their checkpoint, below).
    expected = 1 if engine == "horovod" else processes
    assert len(stops) == expected and len(set(stops)) == 1, text[-5000:]
    stop = int(stops[0])
    assert 13 <= stop < 60, text[-5000:]
    resumed = re.findall(r"resumed from \S+ckpt-(\d+) at step (\d+)", text)
    assert resumed == [(str(stop), str(stop))] * processes, text[-5000:]


# Each launcher of the scripts that the requeue test above does not
# already stop: Horovod's ranks over ssh, multi_worker's srun step, the
# async job's coordinator in the batch shell.
CANCELLED_JOBS = {
    "horovod": ("slurm/course_sync_cifar100.sbatch",
                {"HOROVOD_FLAGS": "--network-interface eth0"}),
    "multi_worker": ("slurm/course_sync_cifar100.sbatch",
                     {"ENGINE": "multi_worker"}),
    "parameter_server": ("slurm/course_async_cifar100.sbatch", {}),
}  # fmt: skip
# Long enough that each job is still training when its turn to be
# cancelled comes; the resubmitted job trains to the end.
CANCELLED_FLAGS = REQUEUE_FLAGS.replace(
    "--train_steps=60", "--train_steps=300"
).replace("--checkpoint_every_steps=7", "--checkpoint_every_steps=100")


def test_a_cancelled_job_ends_with_its_stop_and_the_command_that_resumes(
    cluster, data, tmp_path
):
    """scancel in the middle of a job: its output ends with the step it
    stopped at, the checkpoint written there and the command that resumes
    it; that command, as printed, resumes there (Horovod's job)."""
    if requires_horovod.args[0]:
        pytest.skip("needs Horovod (the pinned requirement set)")
    homes = {name: tmp_path / name for name in CANCELLED_JOBS}
    jobs = {}
    for name, (script, env) in CANCELLED_JOBS.items():
        homes[name].mkdir()
        env = {**env, "EXTRA_FLAGS": CANCELLED_FLAGS}
        jobs[name] = submit_small(cluster, data, homes[name], script, env)
    # Each as soon as it passed step 13 (the jobs start at different times).
    training = dict(jobs)
    deadline = time.monotonic() + 300
    while training and time.monotonic() < deadline:
        for name, job in list(training.items()):
            if re.search(r"step 13/300", output_of(homes[name])):
                cluster.run(["scancel", job])
                del training[name]
        time.sleep(0.5)
    assert not training, {n: output_of(homes[n])[-3000:] for n in training}
    resume, stops = {}, {}
    for name, job in jobs.items():
        assert cluster.wait(job, JOB_TIMEOUT)["JobState"] == "CANCELLED"
        (errors,) = glob.glob(os.path.join(homes[name], "*.err"))
        with open(errors) as stream:
            stopped, resume[name] = stream.read().splitlines()[-2:]
        found = re.search(
            r"course_job: stopped by SIGTERM; the newest checkpoint: "
            r"step (\d+) \((\S+)/ckpt-(\d+)\)$",
            stopped,
        )
        assert found, output_of(homes[name])[-5000:]
        step, run, suffix = found.groups()
        # The stop's own checkpoint (the periodic ones are 100 steps apart).
        assert step == suffix and 13 <= int(step) < 100, stopped
        assert os.path.exists(f"{run}/ckpt-{step}.index"), stopped
        assert resume[name].endswith(
            "course_job: to resume there, submit it again from the "
            f"repository with the same LOG_ROOT: LOG_ROOT={run} sbatch "
            f"scripts/{CANCELLED_JOBS[name][0]} (a job the scheduler "
            "requeues resumes by itself)"
        ), resume[name]
        stops[name] = step
    # The printed command, as typed in a checkout (its scripts/ folder),
    # with the first job's REPO, EXTRA_FLAGS and data.
    home = homes["horovod"]
    log_root, script = re.search(
        r"same LOG_ROOT: LOG_ROOT=(\S+) sbatch (\S+) \(", resume["horovod"]
    ).groups()
    (home / "scripts").symlink_to(os.path.join(ROOT, "scripts"))
    for old in glob.glob(os.path.join(home, "*.out")) + glob.glob(
        os.path.join(home, "*.err")
    ):
        os.rename(old, f"{old}.first")
    env = {
        "TRAIN_DATA": data["TRAIN_DATA"], "EVAL_DATA": data["EVAL_DATA"],
        "HOME": str(home), "REPO": ROOT, "EXTRA_FLAGS": CANCELLED_FLAGS,
        **CANCELLED_JOBS["horovod"][1], "LOG_ROOT": log_root,
    }  # fmt: skip
    again = cluster.sbatch(script, home, env, ("--ntasks-per-node=1",))
    record = cluster.wait(again, JOB_TIMEOUT)
    text = output_of(home)
    assert record["JobState"] == "COMPLETED", text[-5000:]
    resumed = re.findall(r"resumed from \S+ckpt-(\d+) at step (\d+)", text)
    step = stops["horovod"]
    assert resumed == [(step, step)] * 2, text[-5000:]


# Every script ---------------------------------------------------------------

# name: (script, environment, sbatch options, processes, nodes used).
# The course's multi-node jobs (the sync job with Horovod over ssh and with
# multi_worker, the async job) run as a plain user on this same cluster
# (`tests/test_cluster_user.py`), which is how students run them.
JOBS = {
    "course_cifar100": (
        "slurm/course_cifar100.sbatch", {"EXTRA_FLAGS": f"{SMALL} {CPU}"},
        (), 1,
    ),
    "course_tinyimagenet": (
        "slurm/course_tinyimagenet.sbatch",
        {"EXTRA_FLAGS": f"{SMALL.replace(' --eval_batch_count=1', '')} {CPU}"},
        (), 1,
    ),
    "resnet18_cifar100": (
        "slurm/resnet18_cifar100.sbatch",
        {"EXTRA_FLAGS": SMALL.replace("--model=resnet20", "--image_size=32 "
                                      "--stem=cifar") + f" {CPU}"},
        (), 1,
    ),
    # One rank per node instead of the header's four, by sbatch's options.
    "train_horovod": (
        "train_horovod.slurm",
        {"EXTRA_FLAGS": SMALL.replace("--batch_size=8 ", ""),
         "HOROVOD_FLAGS": "--network-interface eth0"},
        ("--ntasks-per-node=1", "--gpus-per-node=1"), 2,
    ),
}  # fmt: skip
HOROVOD_JOBS = ("train_horovod",)


def submit(cluster, name, data, home):
    """Submits job `name` of JOBS from `home` (its HOME); the job id."""
    script, env, options, _ = JOBS[name]
    env = {**data, **env, "HOME": str(home), "REPO": ROOT}
    if name == "course_tinyimagenet":  # Its data are under DATA_ROOT.
        del env["TRAIN_DATA"], env["EVAL_DATA"]
    path = os.path.join(ROOT, "scripts", script)
    return cluster.sbatch(path, cwd=home, env=env, args=options)


@pytest.mark.parametrize("name", JOBS)
def test_every_slurm_script_completes(cluster, data, tmp_path, name):
    if name in HOROVOD_JOBS and requires_horovod.args[0]:
        pytest.skip("needs Horovod (the pinned requirement set)")
    home = tmp_path
    job_id = submit(cluster, name, data, home)
    record = cluster.wait(job_id, JOB_TIMEOUT)
    text = output_of(home)
    assert record["JobState"] == "COMPLETED", text[-5000:]
    completed = cluster.completions(job_id)
    assert [r["JobState"] for r in completed] == ["COMPLETED"], completed
    runs = glob.glob(os.path.join(home, "runs", "*"))
    assert len(runs) == 1, runs  # $HOME/runs/<preset>-<job id>
    assert runs[0].endswith(f"-{job_id}"), runs
    with open(os.path.join(runs[0], "eval.csv")) as stream:
        rows = list(csv.DictReader(stream))
    assert int(rows[-1]["step"]) == 2, rows
    assert os.path.getsize(os.path.join(runs[0], "learning_curve.png")) > 0
    # Each process of the job says where it runs: a one-process job on
    # one of the nodes, the others on both.
    hosts = re.findall(r"process \d+ on host (\S+):", text)
    assert len(hosts) == JOBS[name][3], text[-5000:]
    nodes = {host for host, _ in NODES}
    assert set(hosts) <= nodes, hosts
    assert len(set(hosts)) == min(len(hosts), len(nodes)), hosts


# Across the nodes ---------------------------------------------------------

Spec = engine_runs.Spec


def srun_workers(cluster, args, timeout=400):
    """`tests/hvd_worker.py` as one task per node of a job step (srun).

    Returns:
      `(exit code, output, dump dir)`.
    """
    dump_dir = engine_runs.new_dir("slurm")
    result = cluster.run(
        ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
         sys.executable, engine_runs.WORKER, f"--dump_dir={dump_dir}",
         f"--log_root={dump_dir}/log", *args],
        check=False, cwd=ROOT, timeout=timeout,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr, dump_dir


def assert_on_both_nodes(output):
    hosts = re.findall(r"process \d+ on host (\S+):", output)
    assert sorted(hosts) == ["node1", "node2"], output[-3000:]


def assert_workers_identical(dump_dir, name="weights"):
    first, second = (
        dumped_weights(dump_dir, 0, name),
        dumped_weights(dump_dir, 1, name),
    )
    assert len(first) == len(second) > 0
    for ours, theirs in zip(first, second, strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_multi_worker_across_nodes_equals_one_process(cluster):
    """Two srun tasks, one per node: SlurmClusterResolver's cluster on the
    nodes' bridge addresses, no TF_CONFIG and no --worker_hosts."""
    code, output, dump_dir = srun_workers(
        cluster,
        [*engine_runs.equivalence_flags(0.4), "--distribution=multi_worker"],
    )
    assert code == 0, output[-5000:]
    assert_on_both_nodes(output)
    assert "global batch 16 over 2 replica(s) (multi_worker)" in output
    assert_workers_identical(dump_dir)
    (single,) = engine_runs.equivalence_runs(Spec("default"))
    engine_runs.assert_same_weights(
        dumped_weights(dump_dir, 0),
        single.weights(),
        single.weights(name="first"),
    )


def test_averaging_every_step_across_nodes_equals_synchronous_sgd(cluster):
    code, output, dump_dir = srun_workers(
        cluster,
        [*engine_runs.equivalence_flags(0.8), "--distribution=averaging",
         "--average_every=1"],
    )  # fmt: skip
    assert code == 0, output[-5000:]
    assert_on_both_nodes(output)
    assert "over 2 replica(s) (averaging)" in output
    (sync,) = engine_runs.equivalence_runs(Spec("default"))
    for rank in (0, 1):
        engine_runs.assert_same_weights(
            dumped_weights(dump_dir, rank),
            sync.weights(),
            sync.weights(name="first"),
        )


def test_batch_norm_statistics_agree_across_nodes(cluster, synthetic_cifar):
    code, output, dump_dir = srun_workers(
        cluster,
        ["--dataset=cifar10", f"--train_data_path={synthetic_cifar['train']}",
         f"--eval_data_path={synthetic_cifar['eval']}", "--model=resnet8",
         "--batch_size=32", "--train_steps=4", "--dtype=float32",
         "--ema_decay=0.9", "--eval_batch_count=1",
         "--distribution=multi_worker"],
    )  # fmt: skip
    assert code == 0, output[-5000:]
    assert_on_both_nodes(output)
    assert (
        len(dumped_weights(dump_dir, 0)) > 30
    )  # Kernels, BN scale/offset/mean/var.
    assert_workers_identical(dump_dir)
    assert_workers_identical(dump_dir, "ema")


@requires_horovod
def test_horovod_ranks_over_ssh_equal_one_process(cluster):
    """horovodrun on node1 starts the rank on node2 over ssh, as a cluster
    user does in an allocation, and Gloo talks over the bridge (eth0)."""
    dump_dir = engine_runs.new_dir("slurm_horovod")
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    result = cluster.run(
        [horovodrun, "-np", "2", "-H", "node1:1,node2:1", "--gloo",
         "--network-interface", "eth0", sys.executable, engine_runs.WORKER,
         f"--dump_dir={dump_dir}", f"--log_root={dump_dir}/log",
         *engine_runs.equivalence_flags(0.4), "--distribution=horovod"],
        host="node1", check=False, cwd=ROOT, timeout=400,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert_on_both_nodes(output)
    assert_workers_identical(dump_dir)
    (single,) = engine_runs.equivalence_runs(Spec("default"))
    engine_runs.assert_same_weights(
        dumped_weights(dump_dir, 0),
        single.weights(),
        single.weights(name="first"),
    )


def test_parameter_server_on_another_node_trains_like_one_process(
    cluster, data, tmp_path
):
    """The async job with one slot per node: the ps on node1, its worker on
    node2, the coordinator in the batch shell on node1; one worker runs the
    steps one after another, as one process does."""
    flags = [
        "--model=resnet20", "--batch_size=16", "--train_steps=12",
        "--log_every_steps=4", "--eval_every_steps=1000",
        "--eval_batch_count=1",
    ]  # fmt: skip
    cifar = {key: data[key] for key in ("TRAIN_DATA", "EVAL_DATA")}
    job = cluster.sbatch(
        os.path.join(ROOT, "scripts", "slurm", "course_async_cifar100.sbatch"),
        cwd=tmp_path, args=("--ntasks-per-node=1",),
        env={**cifar, "HOME": str(tmp_path), "REPO": ROOT,
             "LOG_ROOT": str(tmp_path / "ps"), "EXTRA_FLAGS": " ".join(flags)},
    )  # fmt: skip
    local = subprocess.run(
        [sys.executable, "resnet_main.py", "--preset=course_async_cifar100",
         "--distribution=default", f"--train_data_path={cifar['TRAIN_DATA']}",
         f"--eval_data_path={cifar['EVAL_DATA']}",
         f"--log_root={tmp_path / 'local'}", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    record = cluster.wait(job, JOB_TIMEOUT)
    text = output_of(tmp_path)
    assert record["JobState"] == "COMPLETED", text[-5000:]
    assert "ps node1:" in text and "workers node2:" in text, text[-3000:]
    hosts = re.findall(r"process \d+ on host (\S+):", text)
    assert sorted(hosts) == ["node1", "node1", "node2"], text[-3000:]
    loss = re.compile(r"step (\d+)/12 .*: loss ([0-9.]+)")
    remote = [(int(s), float(v)) for s, v in loss.findall(text)]
    expected = [(int(s), float(v)) for s, v in loss.findall(local.stderr)]
    assert [s for s, _ in remote] == [s for s, _ in expected] == [4, 8, 12]
    for (_, value), (_, reference) in zip(remote, expected, strict=True):
        assert value == pytest.approx(reference, abs=0.01)


# Failures -------------------------------------------------------------------


def test_a_killed_job_loses_only_the_steps_since_its_checkpoint(
    cluster, data, tmp_path
):
    """SIGKILL to the training processes of a 2-node job: submitting
    it again with the same LOG_ROOT resumes from the last periodic
    checkpoint, with no hand edit (a stale run lock is taken over)."""
    env = {"ENGINE": "multi_worker", "LOG_ROOT": str(tmp_path / "run")}
    script = "slurm/course_sync_cifar100.sbatch"
    first = submit_small(cluster, data, tmp_path, script, env)
    wait_for_output(tmp_path, r"step 16/60")
    # As a crash or the out-of-memory killer would (scancel sends SIGTERM
    # first, whatever the signal asked).
    trainers = [
        pid
        for host, _ in NODES
        for pid in trainers_on(cluster, host, env["LOG_ROOT"])
    ]
    assert len(trainers) == 2, trainers
    for pid in trainers:
        os.kill(pid, signal.SIGKILL)
    assert cluster.wait(first, JOB_TIMEOUT)["JobState"] != "COMPLETED"
    assert "resnet_main: stopped" not in output_of(tmp_path)
    second = submit_small(cluster, data, tmp_path, script, env)
    record = cluster.wait(second, JOB_TIMEOUT)
    text = output_of(tmp_path)
    assert record["JobState"] == "COMPLETED", text[-5000:]
    resumed = re.findall(r"resumed from \S+ckpt-(\d+) at step \d+", text)
    # The last checkpoint before the kill: every 7 steps, at 14 or later.
    assert len(resumed) == 2 and len(set(resumed)) == 1, text[-5000:]
    assert int(resumed[0]) % 7 == 0 and int(resumed[0]) >= 14, resumed


def test_a_job_requeued_while_its_node_was_lost_gets_its_gpus_back(
    cluster, data, tmp_path
):
    """`scontrol requeue` while node2 does not answer, node2 set DOWN,
    then back: Slurm 21.08 to 23.02.1 starts such a requeued job without
    the GPUs it asked for, and no srun of it starts ("Invalid generic
    resource (gres) specification"). The job says so and requeues itself
    once more, which gets them, and completes (docs/reliability.md). A cut
    link takes Slurm a minute and more to notice; a frozen slurmd and an
    admin's DOWN come to the same in seconds."""
    if requires_horovod.args[0]:
        pytest.skip("needs Horovod (the pinned requirement set)")
    env = {"LAUNCHER": "srun", "EXTRA_FLAGS": SMALL}
    job = submit_small(
        cluster, data, tmp_path, "slurm/course_sync_cifar100.sbatch", env
    )
    wait_for_output(tmp_path, r"2 ranks on \S+ \(srun\)")
    slurmd = cluster.daemon_pid("node2", "slurmd")
    os.kill(slurmd, signal.SIGSTOP)
    try:
        cluster.run(["scontrol", "requeue", job])
        # node2 the last node of the job to end, as a lost node is: node1
        # ends its part by KillWait (30 s; srun waits for node2 as long).
        cluster.wait_for_node("node1", ("IDLE",), 120)
        cluster.run(["scontrol", "update", "nodename=node2", "state=down",
                     "reason=lost"])  # fmt: skip
    finally:
        os.kill(slurmd, signal.SIGCONT)
    # As an administrator would; ReturnToService may have come first.
    cluster.run(
        ["scontrol", "update", "nodename=node2", "state=resume"], check=False
    )
    cluster.wait_for_node("node2", ("IDLE", "MIXED", "ALLOCATED"), 60)
    try:
        record = cluster.wait(job, JOB_TIMEOUT)
        text = output_of(tmp_path)
        assert record["JobState"] == "COMPLETED", text[-5000:]
        assert record["Restarts"] == "2", text[-5000:]
        assert "Invalid generic resource" not in text, text[-5000:]
        assert re.search(
            r"course_job: Slurm started this requeued job without the GPUs "
            r"it asked for .*: requeueing, restart 2 of at most 2",
            text,
        ), text[-5000:]
    finally:
        # The GPUs of the start without them stay counted as used, until
        # slurmctld rebuilds its counts (docs/reliability.md).
        cluster.run(["scontrol", "reconfigure"])


def trainers_on(cluster, host, needle):
    """Pids of the `python resnet_main.py` processes on `host` (its network
    namespace) whose command line holds `needle`."""
    namespace = os.stat(f"/run/netns/{cluster.namespace(host)}").st_ino
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{name}/ns/net").st_ino != namespace:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as stream:
                args = stream.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args[1:2] == ["resnet_main.py"] and needle in " ".join(args):
            found.append(int(name))
    return found


def test_a_frozen_worker_on_the_other_node_ends_the_job(cluster, data):
    """SIGSTOP to the worker on node2: no connection is reset, so only
    --peer_timeout_secs (or the coordination service's heartbeat)
    ends node1's wait; it exits 4 (a lost task) naming the checkpoint a
    rerun resumes from, and srun ends the step."""
    dump_dir = str(engine_runs.new_dir("slurm_frozen"))
    command = [
        "srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        sys.executable, "resnet_main.py", "--distribution=multi_worker",
        f"--train_data_path={data['TRAIN_DATA']}",
        f"--eval_data_path={data['EVAL_DATA']}", "--dataset=cifar100",
        f"--log_root={dump_dir}/log", "--model=resnet20", "--batch_size=8",
        "--train_steps=100000", "--log_every_steps=1",
        "--peer_timeout_secs=15",
    ]  # fmt: skip
    process = subprocess.Popen(
        cluster.on("head", command), env=cluster.env, cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            if re.search(r"step 3/", line):
                break
        (frozen,) = trainers_on(cluster, "node2", dump_dir)
        os.kill(frozen, signal.SIGSTOP)
        stopped = time.monotonic()
        rest, _ = process.communicate(timeout=300)
        output.append(rest)
    finally:
        if process.poll() is None:
            process.kill()
    text = "".join(output)
    assert "lost a task of the training cluster" in text, text[-5000:]
    assert time.monotonic() - stopped < 120, text[-3000:]
    assert process.returncode != 0

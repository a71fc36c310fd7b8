"""The batch jobs' decisions and messages (tf_resnet/jobs/).

What scripts/course_job.sh asks of the module, under both schedulers,
without a scheduler, TensorFlow or a process: the allocation's task slots,
the ports, the data and run directory of a task, which task a failed job
step ends with, and the lines that say where a stopped run resumes. The
scripts themselves run in tests/test_batch_scripts.py.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT
from tf_resnet.config import presets
from tf_resnet.config.datasets import DATASETS
from tf_resnet.config.families import WEIGHTS
from tf_resnet.jobs import allocation, cli, shell, status, tasks


def slurm(**more):
    """The environment course_job.sh passes in a Slurm job 4242."""
    return {
        "SCHEDULER": "slurm",
        "SLURM_JOB_ID": "4242",
        "REPO": "/repo",
        "PYTHON": "/repo/.venv/bin/python",
        "DATA_ROOT": "/repo/datasets",
        "HOME": "/home/me",
        **more,
    }


def pbs(nodefile, **more):
    """The same in a PBS job 77.server with the node file `nodefile`."""
    env = slurm(**more)
    del env["SLURM_JOB_ID"]
    return {
        **env,
        "SCHEDULER": "pbs",
        "PBS_JOBID": "77.server",
        "PBS_NODEFILE": str(nodefile),
    }


@pytest.mark.parametrize(
    "text, counts",
    [("2", [2]), ("4(x2),2", [4, 4, 2]), ("1(x3)", [1, 1, 1])],
)
def test_slurm_tasks_per_node(text, counts):
    assert allocation.tasks_per_node(text) == counts


def test_slurm_slots_follow_the_node_list_and_task_counts():
    env = slurm(SLURM_JOB_NODELIST="n[1-3]", SLURM_TASKS_PER_NODE="4(x2),2")
    slots = allocation.job_slots(env, hostnames=["n1", "n2", "n3"])
    assert slots == ["n1"] * 4 + ["n2"] * 4 + ["n3"] * 2
    assert allocation.horovod_hosts(slots) == "n1:4,n2:4,n3:2"
    assert allocation.horovod_plan(slots, "srun") == (10, "n1:4,n2:4,n3:2", "")


def test_pbs_slots_are_the_node_file(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\na\nb\nb\n")
    env = pbs(nodefile)
    assert allocation.job_slots(env) == ["a", "a", "b", "b"]
    assert allocation.addresses(env, "MW_PORT") == [
        "a:17700",
        "a:17701",
        "b:17702",
        "b:17703",
    ]


def test_the_job_port_is_its_own_and_below_linux_outgoing_ports():
    assert allocation.job_port(slurm()) == 10000 + 100 * (4242 % 200)
    assert allocation.job_port(slurm(SLURM_JOB_ID="199")) == 29900
    assert allocation.job_port(slurm(SLURM_JOB_ID="200")) == 10000
    # PBS's id without its server; an array job's index is part of it.
    env = {"SCHEDULER": "pbs", "PBS_JOBID": "12[3].server"}
    assert shell.job_id(env) == "12[3]"
    assert allocation.job_port(env) == 10000 + 100 * 123


def test_a_port_variable_wins_over_the_job_port(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\nb\n")
    env = pbs(nodefile, PS_PORT="5000")
    assert allocation.addresses(env, "PS_PORT") == ["a:5000", "b:5001"]


@pytest.mark.parametrize(
    "slots, ranks_per_node, plan",
    [
        # The course's `aprun -n 2 -N 1` on nodes=2:ppn=16.
        (["a"] * 16 + ["b"] * 16, "1", (2, "a:1,b:1", "1")),
        # By default, the first node's task slots.
        (["a", "a", "b", "b"], "", (4, "a:2,b:2", "2")),
        (["a", "a", "a", "b"], "", (6, "a:3,b:3", "3")),
    ],
)
def test_aprun_ranks_per_node(slots, ranks_per_node, plan):
    assert allocation.horovod_plan(slots, "aprun", ranks_per_node) == plan


@pytest.mark.parametrize(
    "scheduler, more, argv",
    [
        (
            "slurm",
            {"HOROVOD_FLAGS": "--network-interface ib0"},
            ["ignoring_term", "/repo/.venv/bin/horovodrun", "-np", "4", "-H",
             "a:2,b:2", "--gloo", "--network-interface", "ib0"],
        ),
        (
            "slurm",
            {"LAUNCHER": "srun"},
            ["srun", "--ntasks=4", "--distribution=block", "--mpi=pmix"],
        ),
        (
            "slurm",
            {"LAUNCHER": "srun", "SRUN_MPI": "pmi2"},
            ["srun", "--ntasks=4", "--distribution=block", "--mpi=pmi2"],
        ),
        (
            "slurm",
            {"LAUNCHER": "mpirun"},
            ["ignoring_term", "mpirun", "-np", "4"],
        ),
        (
            "pbs",
            {"LAUNCHER": "mpirun"},
            ["ignoring_term", "mpirun", "-np", "4", "-hostfile", "nodes"],
        ),
        (
            "pbs",
            {"LAUNCHER": "aprun", "RANKS_PER_NODE": "1",
             "APRUN_FLAGS": "-d 16"},
            ["aprun", "-n", "2", "-N", "1", "-d", "16"],
        ),
    ],
)  # fmt: skip
def test_horovod_launchers(scheduler, more, argv):
    env = {**slurm(**more), "SCHEDULER": scheduler, "PBS_NODEFILE": "nodes"}
    slots = ["a", "a", "b", "b"]
    found, line, error = allocation.horovod_launcher(env, "sync", slots)
    assert (found, error) == (argv, None)
    launcher = more.get("LAUNCHER", "horovodrun")
    ranks = argv[2] if launcher == "aprun" else "4"
    assert line.startswith(f"sync: {ranks} ranks on a:") and launcher in line


@pytest.mark.parametrize(
    "scheduler, launcher, error",
    [
        ("pbs", "srun", "LAUNCHER=srun needs Slurm; use mpirun or horovodrun"),
        ("slurm", "aprun", "LAUNCHER=aprun is Cray ALPS under PBS; under "
         "Slurm use srun"),
        ("slurm", "ssh", "LAUNCHER=ssh: expected horovodrun, srun, mpirun or "
         "aprun"),
    ],
)  # fmt: skip
def test_a_launcher_of_another_scheduler_is_refused(scheduler, launcher, error):
    env = {**slurm(LAUNCHER=launcher), "SCHEDULER": scheduler}
    found = allocation.horovod_launcher(env, "sync", ["a"])
    assert found == (None, f"sync: 1 ranks on a:1 ({launcher})", error)


def test_aprun_starts_every_task_on_the_compute_nodes(tmp_path):
    """LAUNCHER=aprun: a one-node task `aprun -n 1 -N 1`, the workers and
    servers a PE each, RANKS_PER_NODE a node (the course's `-n 2 -N 1` on
    nodes=2:ppn=16), their addresses those of ALPS's placement."""
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\n" * 16 + "b\n" * 16)
    env = pbs(
        nodefile, LAUNCHER="aprun", RANKS_PER_NODE="1", APRUN_FLAGS="-d 16"
    )
    assert allocation.aprun_launch(env, "1") == [
        "aprun",
        "-n",
        "1",
        "-N",
        "1",
        "-d",
        "16",
    ]
    assert allocation.aprun_launch(env) == [
        "aprun",
        "-n",
        "2",
        "-N",
        "1",
        "-d",
        "16",
    ]
    assert allocation.addresses(env, "PS_PORT") == ["a:17700", "b:17701"]
    # Two per node: the first two slots of each.
    env["RANKS_PER_NODE"] = "2"
    assert allocation.addresses(env, "MW_PORT") == [
        "a:17700",
        "a:17701",
        "b:17702",
        "b:17703",
    ]
    # Without LAUNCHER=aprun, nothing: the task runs in the batch shell.
    assert allocation.aprun_launch(pbs(nodefile)) == []
    assert len(allocation.addresses(pbs(nodefile), "PS_PORT")) == 32


def test_aprun_is_refused_under_slurm_for_every_task(capsys):
    env = {**slurm(LAUNCHER="aprun"), "DATA_ROOT": "/"}
    with pytest.raises(shell.JobError, match="^LAUNCHER=aprun is Cray"):
        allocation.aprun_launch(env, "1")
    # A task's first check says so before anything starts.
    env.update(TRAIN_DATA="/", EVAL_DATA="/")
    assert cli.main(["plan", "single", "course_cifar100"], env) == 2
    assert "error: LAUNCHER=aprun is Cray ALPS" in capsys.readouterr().err


def test_parameter_servers_take_the_first_slots():
    found = ["a:1", "a:2", "b:3", "b:4"]
    assert allocation.parameter_servers(found, "1") == ("a:1", "a:2,b:3,b:4")
    assert allocation.parameter_servers(found, "2") == ("a:1,a:2", "b:3,b:4")
    with pytest.raises(shell.JobError, match="^4 task slots for NUM_PS=4"):
        allocation.parameter_servers(found, "4")


@pytest.mark.parametrize(
    "codes, failed",
    [
        ({}, None),
        ({"0": "0", "1": "0"}, None),
        # A task that failed of itself wins over those that lost it.
        ({"0": "4", "1": "2", "2": "4"}, ("1", "2")),
        ({"0": "4", "1": "4"}, ("0", "4")),
        ({"0": "", "1": "3"}, ("1", "3")),
        ({"0": "137", "1": "2"}, ("0", "137")),
    ],
)
def test_the_failed_task_a_step_ends_with(codes, failed):
    assert status.failed_task(codes) == failed


def test_step_codes_are_read_in_the_shells_order(tmp_path):
    for name, code in (("10", "4"), ("2", "3"), ("1", "0")):
        (tmp_path / name).write_text(f"{code}\n")
    (tmp_path / "folder").mkdir()
    assert status.read_codes(tmp_path) == {"1": "0", "10": "4", "2": "3"}
    assert cli.main(["failed_task", str(tmp_path)]) == 0


def test_step_status_folder_is_fresh_per_run_of_the_job(tmp_path):
    env = slurm(
        SLURM_SUBMIT_DIR=str(tmp_path), SLURM_RESTART_COUNT="1",
        JOB_SHELL="77",
    )  # fmt: skip
    old = tmp_path / ".tf-resnet-steps" / "4242.1.77"
    old.mkdir(parents=True)
    (old / "0").write_text("4\n")
    assert status.step_status_dir(env, "/elsewhere") == str(old)
    assert list(old.iterdir()) == []
    # Another batch shell of the same job id (stand-in jobs) has its own.
    other = status.step_status_dir({**env, "JOB_SHELL": "78"}, "/x")
    assert other != str(old) and os.path.isdir(old)


@pytest.mark.parametrize(
    "code, cause", [(2, "bad flags"), (4, "it lost a peer")]
)
def test_exit_causes(code, cause):
    assert status.exit_cause(str(code)).startswith(cause)
    assert status.exit_cause("1") == "see its output above"


INDEX = """model_checkpoint_path: "/runs/x/ckpt-120"
all_model_checkpoint_paths: "/runs/x/ckpt-100"
all_model_checkpoint_paths: "/runs/x/ckpt-120"
"""


def test_the_newest_checkpoint_is_read_from_the_index(tmp_path):
    assert status.newest_checkpoint("/r", INDEX) == "step 120 (/r/ckpt-120)"
    # Relative names, as TensorFlow writes them.
    text = 'model_checkpoint_path: "ckpt-7"\n'
    assert status.newest_checkpoint("/r", text) == "step 7 (/r/ckpt-7)"
    (tmp_path / "checkpoint").write_text(text)
    found = status.newest_checkpoint(str(tmp_path))
    assert found == f"step 7 ({tmp_path}/ckpt-7)"


def test_before_the_first_checkpoint_the_run_starts_over(tmp_path):
    assert status.newest_checkpoint(str(tmp_path)) == (
        f"none in {tmp_path}, so it starts over"
    )
    assert status.newest_checkpoint("") == (
        "none in the run directory, so it starts over"
    )


@pytest.mark.parametrize(
    "scheduler, more, command",
    [
        (
            "slurm", {},
            "LOG_ROOT=/r sbatch scripts/slurm/course_cifar100.sbatch",
        ),
        ("pbs", {}, "qsub -v LOG_ROOT=/r scripts/pbs/course_cifar100.pbs"),
        # The Cray variant (scripts/cray_job.sh).
        (
            "pbs", {"JOB_SCRIPTS": "scripts/cray"},
            "qsub -v LOG_ROOT=/r scripts/cray/course_cifar100.pbs",
        ),
    ],
)  # fmt: skip
def test_the_stop_report_names_the_resume_command(scheduler, more, command):
    env = {"SCHEDULER": scheduler, **more}
    script = tasks.job_script("course_cifar100", env)
    env = {"SCHEDULER": scheduler, "RUN_DIR": "/r", "JOB_SCRIPT": script}
    stopped, resume = status.stop_report(env, "TERM")
    assert stopped == (
        "stopped by SIGTERM; the newest checkpoint: none in /r, so it "
        "starts over"
    )
    assert resume == (
        "to resume there, submit it again from the repository with the same "
        f"LOG_ROOT: {command} (a job the scheduler requeues resumes by itself)"
    )
    assert status.stop_report(env, "")[0].startswith("stopped; ")


def test_run_directory_and_flags_of_a_task():
    env = slurm()
    assert tasks.run_dir("course_cifar100", env) == (
        "/home/me/runs/course_cifar100-4242"
    )
    env = slurm(LOG_ROOT="/runs/a", EXTRA_FLAGS="--x=1 --log_root=/runs/b")
    assert tasks.run_dir("course_cifar100", env) == "/runs/b"
    assert tasks.task_flags("resnet18_cifar100", env, "/runs/b") == [
        "--train_data_path=/repo/datasets/cifar-100-binary/train.bin",
        "--eval_data_path=/repo/datasets/cifar-100-binary/test.bin",
        "--log_root=/runs/b",
        "--pretrained=/repo/weights/resnet18-f37072fd.pth",
    ]
    env = slurm(TRAIN_DATA="/t", EVAL_DATA="/e")
    assert tasks.task_data("course_tinyimagenet", env)[:2] == ("/t", "/e")
    assert tasks.task_data("course_tinyimagenet", slurm()) == (
        "/repo/datasets/tiny-imagenet-200",
        "/repo/datasets/tiny-imagenet-200",
        "tinyimagenet",
    )


def test_missing_data_names_the_download_and_the_variables(tmp_path):
    env = slurm(DATA_ROOT=str(tmp_path))
    first, errors = tasks.task_checks("course_cifar100", env)
    train = f"{tmp_path}/cifar-100-binary/train.bin"
    assert first == (
        f"course_cifar100 reads: train {train}, eval "
        f"{tmp_path}/cifar-100-binary/test.bin (DATA_ROOT={tmp_path})"
    )
    assert errors[0] == (
        f"{train}: no such file or folder; download it first: "
        f"/repo/.venv/bin/python /repo/data/download.py --dataset=cifar100 "
        f"--output_dir={tmp_path} (or set DATA_ROOT, or TRAIN_DATA and "
        "EVAL_DATA)"
    )
    (tmp_path / "cifar-100-binary").mkdir()
    for name in ("train.bin", "test.bin"):
        (tmp_path / "cifar-100-binary" / name).touch()
    assert tasks.task_checks("course_cifar100", env)[1] == []
    # resnet18_cifar100 also needs its weights.
    (error,) = tasks.task_checks("resnet18_cifar100", env)[1]
    assert error.endswith("--weights=resnet18 (or set PRETRAINED)")
    # A glob matches.
    assert tasks.missing_data(f"{tmp_path}/*/t*.bin", "", "", env) is None


def test_a_missing_file_is_a_logged_error_and_exit_2(tmp_path, capsys):
    env = slurm(DATA_ROOT=str(tmp_path), SCHEDULER="slurm")
    assert cli.main(["plan", "single", "course_tinyimagenet"], env) == 2
    first, error = capsys.readouterr().err.splitlines()
    stamp = r"\d\d:\d\d:\d\d course_job: "
    assert re.fullmatch(stamp + r"course_tinyimagenet reads: .*", first)
    assert re.fullmatch(stamp + r"error: .*tiny-imagenet-200: no such.*", error)


def test_a_task_prints_its_run_directory_script_and_command(tmp_path, capsys):
    (tmp_path / "tiny-imagenet-200").mkdir()
    env = pbs(tmp_path / "nodes", DATA_ROOT=str(tmp_path), EXTRA_FLAGS="--x=1")
    assert cli.main(["plan", "single", "course_tinyimagenet"], env) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "/home/me/runs/course_tinyimagenet-77",
        "scripts/pbs/course_tinyimagenet.pbs",
        "",  # One process: no step status.
        "",  # No servers.
        "0",
        "/repo/.venv/bin/python",
        "resnet_main.py",
        "--preset=course_tinyimagenet",
        f"--train_data_path={tmp_path}/tiny-imagenet-200",
        f"--eval_data_path={tmp_path}/tiny-imagenet-200",
        "--log_root=/home/me/runs/course_tinyimagenet-77",
        "--num_gpus=0",
        "--x=1",
    ]
    assert err.splitlines()[-1].endswith(
        f"course_tinyimagenet on {os.uname().nodename}"
    )


@pytest.mark.parametrize(
    "restarts, requeue, line",
    [
        ("0", True, "requeueing, restart 1 of at most 2"),
        ("2", False, "restarted 2 times already (MAX_REQUEUES=2)"),
    ],
)
def test_a_lost_task_requeues_a_slurm_job_a_few_times(restarts, requeue, line):
    env = slurm(SLURM_RESTART_COUNT=restarts)
    found, text = status.requeue_after_lost_task(env)
    assert found == requeue and line in text
    env = {"SCHEDULER": "pbs"}
    assert status.requeue_after_lost_task(env) == (False, None)


# `scontrol show job -d` of a 2-node job that asked for 2 GPUs a node
# (Slurm 22.05.8), the lines that matter: as Slurm started it, and as it
# restarted it after a requeue while a node was lost (docs/reliability.md).
GRANTED = """\
   JOB_GRES=gpu:4
     Nodes=node[1-2] CPU_IDs=31 Mem=0 GRES=gpu:2(IDX:0-1)
   TresPerNode=gres:gpu:2
"""
NOT_GRANTED = """\
   JOB_GRES=(null)
     Nodes=node[1-2] CPU_IDs=31 Mem=0 GRES=
   TresPerNode=gres:gpu:2
"""


@pytest.mark.parametrize(
    "record, without",
    [
        (GRANTED, False),
        (NOT_GRANTED, True),
        (
            NOT_GRANTED.replace("TresPerNode=gres:gpu", "TresPerJob=gres:gpu"),
            True,
        ),
        # No GPUs asked for: none to miss.
        (NOT_GRANTED.replace("   TresPerNode=gres:gpu:2\n", ""), False),
        (NOT_GRANTED.replace("gres:gpu:2", "gres:shard:2"), False),
    ],
)
def test_a_job_started_without_the_gpus_it_asked_for_is_found(record, without):
    assert status.started_without_gpus(record) == without


@pytest.mark.parametrize(
    "restarts, requeue, line",
    [
        ("1", True, "requeueing, restart 2 of at most 2"),
        ("2", False, "restarted 2 times already (MAX_REQUEUES=2)"),
    ],
)
def test_a_requeued_job_without_its_gpus_requeues_again(
    restarts, requeue, line
):
    env = slurm(SLURM_RESTART_COUNT=restarts)
    found, text = status.requeue_without_gpus(env, NOT_GRANTED)
    assert found == requeue and line in text
    assert "without the GPUs it asked for" in text
    assert status.requeue_without_gpus(env, GRANTED) == (False, None)


@pytest.mark.parametrize(
    "env, gpus",
    [
        ({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0"}, "4"),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, "3"),
        ({}, "0"),
    ],
)
def test_gpus_on_node(env, gpus):
    assert allocation.gpus_on_node(env, "n1") == gpus


def test_gpus_on_node_from_torques_gpu_file(tmp_path):
    gpufile = tmp_path / "gpus"
    gpufile.write_text("n1-gpu0\nn1-gpu1\nn2-gpu0\n")
    assert allocation.gpus_on_node({"PBS_GPUFILE": str(gpufile)}, "n1") == "2"


def test_the_module_starts_without_tensorflow():
    """Each call of the job starts a process: standard library only."""
    code = (
        "import sys; import tf_resnet.jobs.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras', 'numpy', 'absl')))"
    )
    found = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.strip() == "[]", found.stderr


def _plan(kind, preset, env, tmp_path, capsys):
    """`(lines, log)` of `plan KIND PRESET` with the data in `tmp_path`."""
    data = tmp_path / "cifar-100-binary"
    data.mkdir(exist_ok=True)
    for name in ("train.bin", "test.bin"):
        (data / name).touch()
    env = {**env, "DATA_ROOT": str(tmp_path), "PWD": str(tmp_path)}
    assert cli.main(["plan", kind, preset], env) == 0, capsys.readouterr()
    out, err = capsys.readouterr()
    return out.splitlines(), err


def test_a_slurm_step_runs_each_task_in_the_task_shell(
    tmp_path, capsys, monkeypatch
):
    """srun's Horovod ranks and multi_worker workers: one job step, each
    task in scripts/task.sh, which writes its code to the step's folder."""
    env = slurm(
        LAUNCHER="srun", SLURM_SUBMIT_DIR=str(tmp_path), JOB_SHELL="9",
        SLURM_TASKS_PER_NODE="2", SLURM_JOB_NODELIST="n1",
    )  # fmt: skip
    # `scontrol show hostnames n1`, which this machine has not.
    job_slots = allocation.job_slots
    monkeypatch.setattr(
        allocation, "job_slots", lambda env: job_slots(env, ["n1"])
    )
    shell = ["/bin/bash", os.path.join(ROOT, "scripts", "task.sh"), "/repo"]
    step = f"{tmp_path}/.tf-resnet-steps/4242.0.9"
    main = [
        "/repo/.venv/bin/python", "resnet_main.py",
        "--preset=course_sync_cifar100",
        f"--train_data_path={tmp_path}/cifar-100-binary/train.bin",
        f"--eval_data_path={tmp_path}/cifar-100-binary/test.bin",
        "--log_root=/home/me/runs/course_sync_cifar100-4242",
    ]  # fmt: skip
    lines, err = _plan("ranks", "course_sync_cifar100", env, tmp_path, capsys)
    assert "course_sync_cifar100: 2 ranks on n1:2 (srun)" in err
    assert lines[:5] == [
        "/home/me/runs/course_sync_cifar100-4242",
        "scripts/slurm/course_sync_cifar100.sbatch",
        step, "", "0",
    ]  # fmt: skip
    srun = ["srun", "--ntasks=2", "--distribution=block"]
    assert lines[5:] == [*srun, "--mpi=pmix", *shell, step, "", *main]
    assert os.path.isdir(step)
    lines, err = _plan("workers", "course_sync_cifar100", env, tmp_path, capsys)
    workers = "n1:14200,n1:14201"
    assert f"2 multi_worker workers at {workers}" in err
    assert lines[5:] == [
        *srun, "--mpi=none", *shell, step, "1", *main,
        "--distribution=multi_worker", f"--worker_hosts={workers}",
    ]  # fmt: skip


def test_the_async_plan_names_its_servers_and_coordinator(tmp_path, capsys):
    """Under PBS: a pbsdsh per server slot (the shell adds the index), the
    coordinator with the cluster's addresses before the task's flags."""
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\nb\nb\n")
    env = pbs(nodefile, NUM_PS="1", EXTRA_FLAGS="--x=1")
    lines, err = _plan("async", "course_async_cifar100", env, tmp_path, capsys)
    assert "course_async_cifar100: ps a:17700, workers b:17701,b:17702" in err
    server = [
        "/repo/scripts/ps_task.sh", "/repo/.venv/bin/python", "/repo",
        "a:17700", "b:17701,b:17702",
    ]  # fmt: skip
    assert lines[2:11] == [
        "",
        "a:17700,b:17701,b:17702",
        "6",
        "pbsdsh",
        *server,
    ]
    assert lines[11:16] == [
        "/repo/.venv/bin/python", "resnet_main.py",
        "--preset=course_async_cifar100", "--ps_hosts=a:17700",
        "--worker_hosts=b:17701,b:17702",
    ]  # fmt: skip
    assert lines[-1] == "--x=1"


def test_pbs_multi_worker_workers_run_in_the_batch_shell(tmp_path, capsys):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\nb\n")
    lines, _ = _plan(
        "workers", "course_sync_cifar100", pbs(nodefile), tmp_path, capsys
    )
    assert lines[2] == ""  # pbs_workers keeps the codes itself.
    assert lines[5:7] == ["pbs_workers", "2"]
    assert lines[-1] == "--worker_hosts=a:17700,b:17701"


def test_each_preset_reads_its_datasets_default_archive():
    """The presets table names the data (its dataset, whose default archive
    is what data/download.py fetches) and the weights: no other table."""
    for preset, settings in presets.PRESETS.items():
        archive = next(iter(DATASETS[settings["dataset"]].archives.values()))
        train, test, dataset = tasks.task_data(preset, slurm())
        assert dataset == settings["dataset"]
        assert train.startswith(f"/repo/datasets/{archive.folder}")
        assert test.startswith(f"/repo/datasets/{archive.folder}")
    assert set(presets.PRETRAINED) <= set(presets.PRESETS)
    assert set(presets.PRETRAINED.values()) <= set(WEIGHTS)


def test_stopping_the_training_signals_resnet_main_only(tmp_path):
    """Ahead of the time limit the job SIGTERMs its training processes, at
    any depth below the batch shell, and no launcher: a real process tree."""
    main = tmp_path / "resnet_main.py"
    main.write_text("import time\ntime.sleep(60)\n")
    shell = subprocess.Popen(
        ["/bin/bash", "-c", f"{sys.executable} {main} & sleep 60 & wait"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while len(status.descendants(shell.pid)) < 2:
            assert time.monotonic() < deadline, "the tree did not start"
            time.sleep(0.05)
        training, sleeping = status.descendants(shell.pid)
        with open(f"/proc/{training}/cmdline", "rb") as stream:
            if b"resnet_main.py" not in stream.read():
                training, sleeping = sleeping, training
        status.stop_training({"JOB_SHELL": str(shell.pid), "SCHEDULER": "pbs"})
        deadline = time.monotonic() + 10
        while training in status.descendants(shell.pid):
            assert time.monotonic() < deadline, "resnet_main.py still runs"
            time.sleep(0.05)
        assert status.descendants(shell.pid) == [sleeping]
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()


def test_the_coordinator_waits_for_its_servers(tmp_path, capsys):
    """Up to every server's port on loopback, not past a server that died
    or START_TIMEOUT, each a line of the job's log and exit 1."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = f"127.0.0.1:{listening.getsockname()[1]}"
        with socket.socket() as closed:  # A port nothing listens on.
            closed.bind(("127.0.0.1", 0))
            down = f"127.0.0.1:{closed.getsockname()[1]}"
            alive = str(os.getpid())
            assert cli.main(["wait_for_servers", up, alive], {}) == 0
            dead = subprocess.Popen(["true"])
            dead.wait()
            env = {"START_TIMEOUT": "60"}
            args = ["wait_for_servers", f"{up},{down}", alive, str(dead.pid)]
            assert cli.main(args, env) == 1
            assert capsys.readouterr().err.endswith(
                "error: a server task exited before serving (see above)\n"
            )
            env = {"START_TIMEOUT": "0"}
            assert cli.main(["wait_for_servers", down, alive], env) == 1
            assert capsys.readouterr().err.endswith(
                f"error: no server at {down} after 0s\n"
            )

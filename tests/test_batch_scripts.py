"""The course's Slurm and PBS job scripts, run for real on this machine.

Each test runs a script's body under bash with the variables the scheduler
would set for a 2-task allocation on `localhost` (a node file listing it
twice for PBS), from a directory that is not the repository (PBS starts
jobs in `$HOME`). The data variables point at generated CIFAR or
Tiny-ImageNet files and `EXTRA_FLAGS` shrinks the run to a small model and
two steps, so the very lines that would run on a cluster start real
`resnet_main.py` processes, `horovodrun` ranks, multi_worker workers
(`ENGINE=multi_worker`, under Slurm only) and parameter-server tasks here,
which train and write their checkpoint and `eval.csv`.

`scontrol`, `srun`, `pbsdsh`, Cray's `aprun` and `module` do not exist
here. The tests put stand-ins for them on `PATH` that do what the real
ones do on a one-node allocation (print the host list; run a command once
per task with `SLURM_PROCID` set; run a command on node slot `-n i`; start
`-n` PEs with `ALPS_APP_PE` set, through Open MPI's `mpirun`; record the
modules loaded). They stand in for the scheduler only: every training
process is real. The Cray variant's jobs (`scripts/cray/`, "cray" here)
run under PBS's variables with a node file of two nodes of 16 slots,
`127.0.0.1` and `127.0.0.2`, both this machine.

Everything runs in a loopback-only network namespace, as the local
launchers do, since Horovod's rendezvous and TensorFlow's gRPC servers
listen on all interfaces.

Every Slurm script also runs on a real two-node Slurm
(`tests/test_slurm_cluster.py`, and the course's multi-node ones submitted
by a plain user, `tests/test_cluster_user.py`; marked `cluster`), so here
the scripts
train under PBS's stand-ins, but for the async job, which trains to the end
under the Slurm stand-ins while under PBS it loses a worker;
`test_every_task_has_a_script_per_scheduler` checks what each of the ten
files runs. The runs without Horovod are bash and the engines' own code,
which other tests hold on both sets: they run on the newest set only
(`on_newest_set`), the real Slurm leg running the scripts on the pinned.
"""

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.data_files import (
    cifar100_files,
    resnet18_weights_file,
    tiny_imagenet_root,
)
from tests.helpers import (
    IN_PRIVATE_NETWORK,
    ROOT,
    on_newest_set,
    requires_horovod,
)
from tf_resnet.config.presets import PRESETS

FAKES = {
    "scontrol": """
        #!/bin/bash
        # Stand-in for Slurm's scontrol: only `show hostnames LIST`, for a
        # comma-separated LIST without ranges.
        [[ $1 == show && $2 == hostnames ]] || exit 1
        tr , '\\n' <<<"$3"
    """,
    "srun": """
        #!/bin/bash
        # Stand-in for Slurm's srun on a one-node allocation: runs the
        # command once per task (--ntasks, else SLURM_NTASKS) with
        # SLURM_PROCID set; kills them when it is stopped (as srun does:
        # SIGKILL), or, with --kill-on-bad-exit=1, when one of them fails.
        ntasks=$SLURM_NTASKS kill_on_bad_exit=0
        while [[ $1 == -* ]]; do
          [[ $1 == --ntasks=* ]] && ntasks=${1#*=}
          [[ $1 == --kill-on-bad-exit=1 ]] && kill_on_bad_exit=1
          shift
        done
        pids=()
        for ((i = 0; i < ntasks; i++)); do
          SLURM_PROCID=$i "$@" &
          pids+=($!)
        done
        stop() { kill -KILL "${pids[@]}" 2>/dev/null; wait; exit "$1"; }
        trap 'stop 143' TERM INT
        status=0
        for ((left = ntasks; left > 0; left--)); do
          wait -n || status=$?
          ((status && kill_on_bad_exit)) && stop "$status"
        done
        exit "$status"
    """,
    "pbsdsh": """
        #!/bin/bash
        # Stand-in for PBS's pbsdsh -n INDEX -- COMMAND on a one-node
        # allocation: every slot is this host, so it runs COMMAND here.
        [[ $1 == -n ]] || exit 1
        export PBS_VNODENUM=$2
        shift 2
        [[ $1 == -- ]] && shift
        exec "$@"
    """,
    "aprun": """
        #!/bin/bash
        # Stand-in for Cray ALPS's aprun -n PES -N PER_NODE [-d DEPTH]
        # [-cc LIST] COMMAND on one machine. It refuses a placement the
        # job's nodes cannot hold (PER_NODE x the nodes of $PBS_NODEFILE
        # < PES), as ALPS refuses a claim beyond the reservation, and
        # records its options, a line per call, in $HOME/aprun-calls. The
        # PEs are started by the MPI launcher it is (Open MPI's mpirun
        # here, where Cray's is MPICH), each with ALPS_APP_PE and without
        # mpirun's OMPI_COMM_WORLD_* (which ALPS does not set, and which
        # would make every PE an mpirun rank to resnet_main), and bound
        # as ALPS binds them: each to one core at -d 1 (the default), else
        # to its DEPTH cores, more than this machine has (so unbound).
        # Like aprun it passes SIGTERM on to the PEs and waits for them:
        # mpirun runs in a process group of its own, as the PEs run on
        # compute nodes the job's signals do not reach, since on SIGTERM
        # it would SIGKILL its ranks about a second later.
        pes="" per_node="" bind=core options=()
        while [[ $1 == -* ]]; do
          case $1 in
            -n) pes=$2 ;;
            -N) per_node=$2 ;;
            -d) ((${2} > 1)) && bind=none ;;
            -cc) [[ $2 == none ]] && bind=none ;;
            *) echo "aprun: unknown option $1" >&2 && exit 1 ;;
          esac
          options+=("$1" "$2")
          shift 2
        done
        if [[ -z $pes || -z $per_node ]]; then
          echo "aprun: -n and -N are required here" >&2 && exit 1
        fi
        nodes=$(sort -u "$PBS_NODEFILE" | wc -l)
        if ((per_node * nodes < pes)); then
          echo "aprun: -n $pes -N $per_node: more than $nodes nodes" >&2
          exit 1
        fi
        echo "${options[*]}" >>"$HOME/aprun-calls"
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        set -m
        mpirun -np "$pes" --host "localhost:$pes" --bind-to "$bind" \\
          /bin/bash -c 'export ALPS_APP_PE=$OMPI_COMM_WORLD_RANK
            unset "${!OMPI_COMM_WORLD_@}" && exec "$@"' pe "$@" &
        launcher=$!
        set +m
        forward() {
          local pe
          for pe in $(pgrep -P "$launcher"); do
            kill -TERM -- "-$pe" 2>/dev/null || kill -TERM "$pe"
          done
        }
        trap forward TERM INT
        # wait returns early for each signal trapped.
        while wait "$launcher"; status=$?; kill -0 "$launcher" 2>/dev/null
        do :; done
        exit "$status"
    """,
    "module": """
        #!/bin/bash
        # Stand-in for environment modules' `module load NAME`: the names
        # it loaded, a line each, in $HOME/modules-loaded.
        [[ $1 == load && -n $2 ]] || exit 1
        echo "$2" >>"$HOME/modules-loaded"
    """,
}

SMALL = "--model=resnet20 --train_steps=2 --batch_size=8 --log_every_steps=1"


def scheduler_env(scheduler, home):
    """What Slurm or PBS sets in a batch job of 2 tasks on localhost (the
    Cray variant's PBS: 2 nodes of 16)."""
    if scheduler == "slurm":
        return {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "test",
            "SLURM_JOB_NODELIST": "localhost",
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_NNODES": "1",
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_TASKS_PER_NODE": "2",
            "SLURM_PROCID": "0",
            "SLURM_SUBMIT_DIR": ROOT,
        }
    nodefile = home / "nodefile"
    nodefile.write_text("localhost\nlocalhost\n")
    if scheduler == "cray":
        # The course's nodes=2:ppn=16: two nodes of 16 slots, both this
        # machine (its loopback answers at every 127.x address).
        nodefile.write_text("127.0.0.1\n" * 16 + "127.0.0.2\n" * 16)
    return {
        "PBS_JOBID": "4242.pbsserver",
        "PBS_JOBNAME": "test",
        "PBS_NODEFILE": str(nodefile),
        "PBS_O_WORKDIR": ROOT,
        "PBS_NP": "2",
    }


def run_job(script, scheduler, home, data_env, timeout=240, during=None):
    """Runs `scripts/<scheduler>/<script>` as the scheduler would.

    `during(pid)`, if given, runs while the job does (its session is `pid`).

    Returns:
      `(exit code, output)`; any process the job left is killed after
      it and reported in the output.
    """
    fakes = home / "scheduler-bin"
    fakes.mkdir(exist_ok=True)
    for name, text in FAKES.items():
        path = fakes / name
        path.write_text(textwrap.dedent(text).lstrip())
        path.chmod(0o755)
    env = {
        "PATH": f"{fakes}:{os.environ['PATH']}",
        "HOME": str(home),
        "PYTHONPATH": ROOT,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        **scheduler_env(scheduler, home),
        **data_env,
    }
    output = home / "job.out"
    with open(output, "w") as stream:
        job = subprocess.Popen(
            [sys.executable, "-c", IN_PRIVATE_NETWORK,
             os.path.join(ROOT, "scripts", scheduler, script)],
            cwd=home, env=env, stdout=stream, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            if during:
                during(job.pid)
            code = job.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        left = _kill_session(job.pid)
    text = output.read_text()
    if left:
        text += "\n[test] processes left after the job, killed\n"
    assert code is not None, f"{script} still running after {timeout}s:\n"
    return code, text


def _kill_session(pid, grace=5.0):
    """Kills what is left of the job's session; True if anything was.

    A process still ending `grace` seconds after the job is left; one that
    ends within them is not: a training process's stderr filter
    (`tf_resnet.native_log`) passes the last lines of a process killed by
    the job, then exits. Nor is a zombie, which has exited and only waits
    for init's reaping.
    """
    deadline = time.monotonic() + grace
    while (left := _session_processes(pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in left:
        try:
            os.kill(process, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return bool(left)


def assert_trained(log_root, text, steps=2):
    assert os.path.exists(log_root / f"ckpt-{steps}.index"), text[-4000:]
    with open(log_root / "eval.csv") as stream:
        rows = list(csv.DictReader(stream))
    assert int(rows[-1]["step"]) == steps, rows
    assert os.path.getsize(log_root / "learning_curve.png") > 0


def needs_mpirun(scheduler):
    """Skips a Cray job where the aprun stand-in has no mpirun."""
    if scheduler == "cray" and not shutil.which("mpirun"):
        pytest.skip("no mpirun (the aprun stand-in starts the PEs with it)")


def assert_aprun(scheduler, home, text, placement):
    """A Cray job ran `module load cray-mpich` (the Cray variant's
    default), then its processes under one aprun of `placement`."""
    if scheduler != "cray":
        return
    assert (home / "modules-loaded").read_text() == "cray-mpich\n", text
    assert (home / "aprun-calls").read_text() == f"{placement}\n", text
    # The job's log names it.
    assert f"on the compute nodes: aprun {placement}" in text, text[-4000:]


@pytest.fixture(scope="module")
def cifar100(tmp_path_factory):
    return cifar100_files(tmp_path_factory.mktemp("cifar100"))


@pytest.fixture(scope="module")
def tiny_imagenet(tmp_path_factory):
    return {"DATA_ROOT": tiny_imagenet_root(tmp_path_factory.mktemp("data"))}


@pytest.fixture(scope="module")
def resnet18_weights(tmp_path_factory):
    return resnet18_weights_file(tmp_path_factory.mktemp("weights"))


# "cray": the PBS scripts of a Cray (scripts/cray/, LAUNCHER=aprun).
SCHEDULERS = ["slurm", "pbs", "cray"]
# Where the scripts train here: each Slurm script runs on the real two-node
# Slurm of tests/test_slurm_cluster.py (CI's cluster leg), so the stand-ins
# train with the PBS scripts: the one-node tasks with the Cray variant's
# (under aprun; the PBS one's course_cifar100 is cancelled below), the
# sync task with both, the async task with the Cray variant's and the
# Slurm one's.
STAND_IN = ["cray"]
EXTENSION = {"slurm": "sbatch", "pbs": "pbs", "cray": "pbs"}
TASKS = (
    "course_cifar100",
    "course_tinyimagenet",
    "resnet18_cifar100",
    "course_sync_cifar100",
    "course_async_cifar100",
)
# How course_job.sh runs a preset, by the preset's distribution.
RUNNER = {None: "train_single", "horovod": "train_sync"}
RUNNER["parameter_server"] = "train_async"


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_every_task_has_a_script_per_scheduler(scheduler):
    folder = os.path.join(ROOT, "scripts", scheduler)
    assert sorted(os.listdir(folder)) == sorted(
        f"{task}.{EXTENSION[scheduler]}" for task in TASKS
    )
    for task in TASKS:
        path = os.path.join(folder, f"{task}.{EXTENSION[scheduler]}")
        with open(path) as stream:
            text = stream.read()
        assert os.access(path, os.X_OK), path
        # Named after its task, and it runs that task's preset the way the
        # preset's distribution needs.
        name = "--job-name=" if scheduler == "slurm" else "-N "
        assert re.search(rf"^#(SBATCH|PBS) {name}{task}$", text, re.M), path
        runner = RUNNER[PRESETS[task].get("distribution")]
        assert text.rstrip().endswith(f"\n{runner} {task}"), path


@pytest.mark.slow
@on_newest_set
@pytest.mark.parametrize("scheduler", STAND_IN)
def test_course_cifar100(scheduler, tmp_path, cifar100):
    needs_mpirun(scheduler)
    code, text = run_job(
        f"course_cifar100.{EXTENSION[scheduler]}", scheduler, tmp_path,
        {**cifar100, "EXTRA_FLAGS": f"{SMALL} --eval_batch_count=1"},
    )  # fmt: skip
    assert code == 0, text[-4000:]
    # The default run directory: $HOME/runs/<preset>-<job id>.
    assert_trained(tmp_path / "runs" / "course_cifar100-4242", text)
    assert "training resnet20 on cifar100" in text
    assert_aprun(scheduler, tmp_path, text, "-n 1 -N 1 -d 16")


@pytest.mark.slow
@on_newest_set
@pytest.mark.parametrize("scheduler", STAND_IN)
def test_course_tinyimagenet(scheduler, tmp_path, tiny_imagenet):
    needs_mpirun(scheduler)
    log_root = tmp_path / "tin"
    code, text = run_job(
        f"course_tinyimagenet.{EXTENSION[scheduler]}", scheduler, tmp_path,
        {**tiny_imagenet, "LOG_ROOT": str(log_root), "EXTRA_FLAGS": SMALL},
    )  # fmt: skip
    assert code == 0, text[-4000:]
    assert_trained(log_root, text)
    assert "on tinyimagenet" in text
    root = tiny_imagenet["DATA_ROOT"]
    assert f"reads: train {root}/tiny-imagenet-200, eval" in text
    assert_aprun(scheduler, tmp_path, text, "-n 1 -N 1 -d 16")


@pytest.mark.slow
@on_newest_set
@pytest.mark.parametrize("scheduler", STAND_IN)
def test_resnet18_cifar100(scheduler, tmp_path, cifar100, resnet18_weights):
    needs_mpirun(scheduler)
    log_root = tmp_path / "r18"
    # The preset's network and weights, at 32x32 with the small-image stem
    # the weights were made for.
    small = SMALL.replace("--model=resnet20", "--image_size=32 --stem=cifar")
    code, text = run_job(
        f"resnet18_cifar100.{EXTENSION[scheduler]}", scheduler, tmp_path,
        {**cifar100, "PRETRAINED": resnet18_weights, "LOG_ROOT": str(log_root),
         "EXTRA_FLAGS": f"{small} --eval_batch_count=1"},
    )  # fmt: skip
    assert code == 0, text[-4000:]
    assert_trained(log_root, text)
    assert "training resnet18 on cifar100" in text
    assert_aprun(scheduler, tmp_path, text, "-n 1 -N 1 -d 16")


@requires_horovod
@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["pbs"])
def test_course_sync_cifar100(scheduler, tmp_path, cifar100):
    log_root = tmp_path / "sync"
    code, text = run_job(
        f"course_sync_cifar100.{EXTENSION[scheduler]}", scheduler, tmp_path,
        {**cifar100, "LOG_ROOT": str(log_root), "EXTRA_FLAGS": SMALL},
    )  # fmt: skip
    assert code == 0, text[-4000:]
    assert "2 ranks on localhost:2" in text
    assert "distribution horovod" in text
    assert_trained(log_root, text)


@requires_horovod
@pytest.mark.slow
def test_a_failed_horovod_job_keeps_the_rank_exit_code_and_ends_on_its_cause(
    tmp_path, cifar100
):
    """horovodrun exits 1 for any failed rank, with its traceback last; the
    job exits with the rank's own code (2: bad input), so the scheduler's
    state says which, and its last line is the cause."""
    # A file the job finds but the ranks refuse: not whole records.
    broken = tmp_path / "broken" / "train.bin"
    broken.parent.mkdir()
    broken.write_bytes(b"x" * 100)
    code, text = run_job(
        "course_sync_cifar100.sbatch", "slurm", tmp_path,
        {**cifar100, "TRAIN_DATA": str(broken), "EXTRA_FLAGS": SMALL},
    )  # fmt: skip
    assert code == 2, text[-4000:]
    assert str(broken) in text, text[-4000:]
    job_lines = [
        x for x in text.splitlines() if x and not x.startswith("[test]")
    ]
    last = job_lines[-1]
    assert re.search(
        r"course_job: error: task \d exited with code 2: bad flags or data",
        last,
    ), text[-4000:]


@requires_horovod
@pytest.mark.slow
def test_course_sync_cifar100_on_a_cray(tmp_path, cifar100):
    """The Cray variant: the course's `module load` then `aprun -n 2 -N
    1` on nodes=2:ppn=16, its ranks Horovod's on MPI."""
    needs_mpirun("cray")
    log_root = tmp_path / "sync"
    code, text = run_job(
        "course_sync_cifar100.pbs", "cray", tmp_path,
        {**cifar100, "LOG_ROOT": str(log_root), "EXTRA_FLAGS": SMALL,
         "APRUN_FLAGS": "-d 1"},
    )  # fmt: skip
    assert code == 0, text[-4000:]
    assert "modules loaded: cray-mpich" in text
    assert "2 ranks on 127.0.0.1:1,127.0.0.2:1 (aprun)" in text, text[-4000:]
    # aprun's ranks are one Horovod job of two processes.
    assert text.count("distribution horovod") == 2, text[-4000:]
    assert "over 2 replica(s) (horovod)" in text, text[-4000:]
    assert_trained(log_root, text)
    assert_aprun("cray", tmp_path, text, "-n 2 -N 1 -d 1")


@pytest.mark.slow
@on_newest_set
@pytest.mark.parametrize(
    "scheduler, workers",
    [
        ("pbs", "localhost:14200,localhost:14201"),
        ("cray", "127.0.0.1:14200,127.0.0.2:14201"),
    ],
)
def test_course_sync_cifar100_on_multi_worker(
    scheduler, workers, tmp_path, cifar100
):
    """ENGINE=multi_worker: pbsdsh (aprun on a Cray) starts the workers;
    no Horovod."""
    needs_mpirun(scheduler)
    log_root = tmp_path / "sync_mw"
    code, text = run_job(
        f"course_sync_cifar100.{EXTENSION[scheduler]}", scheduler, tmp_path,
        {**cifar100, "LOG_ROOT": str(log_root), "ENGINE": "multi_worker",
         "EXTRA_FLAGS": f"{SMALL} --eval_batch_count=1"},
    )  # fmt: skip
    assert code == 0, text[-4000:]
    assert f"2 multi_worker workers at {workers}" in text
    # Both workers started, each with its own --task_index.
    assert text.count("distribution multi_worker") == 2, text[-4000:]
    assert "horovodrun" not in text, text[-4000:]
    assert_trained(log_root, text)
    assert "processes left after the job" not in text
    assert_aprun(scheduler, tmp_path, text, "-n 2 -N 1 -d 16")


@pytest.mark.parametrize(
    "task, fetch",
    [
        ("course_cifar100", "--dataset=cifar100"),
        ("course_tinyimagenet", "--dataset=tinyimagenet"),
        ("course_async_cifar100", "--dataset=cifar100"),
    ],
)
def test_a_job_says_where_it_reads_and_missing_data_is_one_line(
    tmp_path, task, fetch
):
    """By default the data root is the checkout's datasets/, where
    data/download.py puts it; the job names the command that fills it."""
    repo = tmp_path / "checkout"  # A checkout without datasets/.
    repo.mkdir()
    (repo / "scripts").symlink_to(os.path.join(ROOT, "scripts"))
    code, text = run_job(
        f"{task}.sbatch", "slurm", tmp_path,
        {"REPO": str(repo), "PYTHON": sys.executable}, timeout=30,
    )  # fmt: skip
    assert code == 2, text
    lines = [x for x in text.splitlines() if "course_job: " in x]
    root = f"{repo}/datasets"
    folder = (
        "tiny-imagenet-200" if "tiny" in task else "cifar-100-binary/train.bin"
    )
    assert lines[0].endswith(
        f"course_job: {task} reads: train {root}/{folder}, eval "
        f"{root}/{folder.replace('train.bin', 'test.bin')} (DATA_ROOT={root})"
    ), lines
    assert len(lines) == 2, lines
    assert lines[1].endswith(
        f"course_job: error: {root}/{folder}: no such file or folder; download "
        f"it first: {sys.executable} {repo}/data/download.py {fetch} "
        f"--output_dir={root} (or set DATA_ROOT, or TRAIN_DATA and EVAL_DATA)"
    ), lines
    assert "resnet_main" not in text


def test_resnet18_job_names_the_missing_weights(tmp_path, cifar100):
    code, text = run_job(
        "resnet18_cifar100.pbs", "pbs", tmp_path,
        {**cifar100, "PRETRAINED": str(tmp_path / "none.pth")}, timeout=30,
    )  # fmt: skip
    assert code == 2, text
    (error,) = [x for x in text.splitlines() if "error:" in x]
    assert error.endswith(
        f"error: {tmp_path}/none.pth: no such file or folder; download it "
        f"first: {ROOT}/.venv/bin/python {ROOT}/data/download.py "
        "--weights=resnet18 (or set PRETRAINED)"
    ), error


@pytest.mark.parametrize(
    "env, error",
    [
        ({"ENGINE": "mpi"}, "ENGINE=mpi: expected horovod or multi_worker"),
        (
            {"LAUNCHER": "aprun"},
            "LAUNCHER=aprun is Cray ALPS under PBS; under Slurm use srun",
        ),
    ],
)
def test_sync_job_refuses_what_it_cannot_run(tmp_path, cifar100, env, error):
    code, text = run_job(
        "course_sync_cifar100.sbatch", "slurm", tmp_path,
        {**cifar100, **env}, timeout=30,
    )  # fmt: skip
    assert code == 2, text
    assert error in text


@pytest.mark.slow
@on_newest_set
@pytest.mark.parametrize(
    "scheduler, servers",
    [
        ("slurm", "ps localhost:14200, workers localhost:14201"),
        # A node each: the course's -N 1.
        ("cray", "ps 127.0.0.1:14200, workers 127.0.0.2:14201"),
    ],
)
def test_course_async_cifar100(scheduler, servers, tmp_path, cifar100):
    needs_mpirun(scheduler)
    log_root = tmp_path / "async"
    code, text = run_job(
        f"course_async_cifar100.{EXTENSION[scheduler]}", scheduler, tmp_path,
        {**cifar100, "LOG_ROOT": str(log_root), "EXTRA_FLAGS": SMALL},
    )  # fmt: skip
    assert code == 0, text[-4000:]
    assert servers in text
    assert "steps run per worker: [2]" in text
    assert_trained(log_root, text)
    # TensorFlow's C++ server lines (absl's, which TF_CPP_MIN_LOG_LEVEL
    # does not reach) are off the log: no session config dumps.
    assert "SessionOptions" not in text, text
    assert "absl::InitializeLog" not in text, text
    # The script stopped the servers it started.
    assert "processes left after the job" not in text
    assert_aprun(scheduler, tmp_path, text, "-n 2 -N 1 -d 16")


def _session_processes(session):
    """`{pid: command line}` of the live processes in session `session`."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.getsid(int(name)) != session:
                continue
            with open(f"/proc/{name}/stat") as stream:
                if stream.read().rpartition(")")[2].split()[0] == "Z":
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as stream:
                found[int(name)] = stream.read().replace(b"\0", b" ").decode()
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return found


@pytest.mark.slow
@on_newest_set
def test_async_job_ends_when_a_worker_is_lost(tmp_path, cifar100):
    """Under PBS: a dead worker stops the job instead of hanging it.

    TensorFlow's coordinator waits for a lost worker to come back, so
    without the job script's watch the job would sit until its time limit.
    """
    log_root = tmp_path / "async"
    steps = "--train_steps=100000 --batch_size=8 --log_every_steps=1"
    output = tmp_path / "job.out"

    def kill_the_worker_once_training(job_pid):
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if re.search(r"step 3/", output.read_text()):
                workers = [
                    pid
                    for pid, line in _session_processes(job_pid).items()
                    if "resnet_main.py --job_name=worker" in line
                ]
                assert len(workers) == 1, _session_processes(job_pid)
                os.kill(workers[0], signal.SIGKILL)
                return
            time.sleep(0.5)
        pytest.fail(f"the job did not train:\n{output.read_text()[-4000:]}")

    code, text = run_job(
        "course_async_cifar100.pbs", "pbs", tmp_path,
        {**cifar100, "LOG_ROOT": str(log_root), "STOP_TIMEOUT": "10",
         "EXTRA_FLAGS": f"--model=resnet20 {steps}"},
        during=kill_the_worker_once_training,
    )  # fmt: skip
    assert code != 0, text[-4000:]
    assert "a server task exited; stopping the coordinator" in text
    # The job's last line is its cause.
    assert re.search(
        r"course_job: error: the coordinator exited with code \d+: ",
        text.strip().splitlines()[-1],
    ), text[-4000:]
    assert "processes left after the job" not in text


# qdel: SIGTERM to the job's process group (PBS signals the job's session
# on its first node; aprun's PEs, on compute nodes, only get aprun's).
CANCELLED_JOBS = [
    pytest.param("course_cifar100.pbs", {}, marks=on_newest_set, id="single"),
    pytest.param(
        "course_sync_cifar100.pbs",
        {"ENGINE": "multi_worker"},
        marks=on_newest_set,
        id="multi_worker",
    ),
    pytest.param(
        "course_sync_cifar100.pbs",
        {"LAUNCHER": "aprun"},
        marks=requires_horovod,
        id="horovod_aprun",
    ),
    # ResNet-56 on CIFAR-10 with horovodrun, outside the course's scripts.
    pytest.param(
        "../train_horovod.pbs", {}, marks=requires_horovod, id="train_horovod"
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("script, env", CANCELLED_JOBS)
def test_a_cancelled_job_ends_with_its_step_checkpoint_and_resume_command(
    tmp_path, cifar100, synthetic_cifar, script, env
):
    """However the training processes were started, the job's last lines
    say where the run stopped and which command resumes it there (the
    processes' own lines may not reach the job's output: a launcher can
    end the ssh sessions of other nodes' ranks)."""
    if "LAUNCHER" in env and not shutil.which("mpirun"):
        pytest.skip("no mpirun (the aprun stand-in starts the ranks with it)")
    log_root = tmp_path / "run"
    output = tmp_path / "job.out"

    def qdel_once_training(job_pid):
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if re.search(r"step 3/", output.read_text()):
                os.killpg(job_pid, signal.SIGTERM)
                return
            time.sleep(0.5)
        pytest.fail(f"the job did not train:\n{output.read_text()[-4000:]}")

    code, text = run_job(
        script, "pbs", tmp_path,
        {**cifar100, "DATA": synthetic_cifar["folder"], **env,
         "LOG_ROOT": str(log_root),
         "EXTRA_FLAGS": "--model=resnet20 --train_steps=100000 --batch_size=8 "
                        "--log_every_steps=1"},
        during=qdel_once_training,
    )  # fmt: skip
    assert code == 128 + signal.SIGTERM, text[-4000:]
    # The training processes stopped at one step and wrote its checkpoint,
    # the run's only one (the periodic ones are further apart).
    (newest,) = re.findall(
        r'model_checkpoint_path: "(.*)"', (log_root / "checkpoint").read_text()
    )
    step = newest.rpartition("-")[2]
    assert os.path.exists(log_root / f"ckpt-{step}.index"), text[-4000:]
    # Those lines may be lost on the way (a launcher may end its ranks'
    # output on SIGTERM); those that arrive agree. aprun's ranks are not
    # killed before they say it: it passes SIGTERM on and waits.
    stops = re.findall(r"resnet_main: stopped: SIGTERM at step (\d+)", text)
    assert set(stops) <= {step}, text[-4000:]
    if "LAUNCHER" in env:
        assert stops == [step, step], text[-4000:]
    job_lines = [
        x for x in text.splitlines() if x and not x.startswith("[test]")
    ]
    stopped, resume = job_lines[-2:]
    assert stopped.endswith(
        f"course_job: stopped by SIGTERM; the newest checkpoint: step {step} "
        f"({log_root}/ckpt-{step})"
    ), text[-4000:]
    submitted = os.path.normpath(f"scripts/pbs/{script}")
    assert resume.endswith(
        "course_job: to resume there, submit it again from the repository "
        f"with the same LOG_ROOT: qsub -v LOG_ROOT={log_root} {submitted} "
        "(a job the scheduler requeues resumes by itself)"
    ), text[-4000:]
    assert "processes left after the job" not in text

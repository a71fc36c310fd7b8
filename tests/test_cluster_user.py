"""A cluster user's world: set-up without root, MPI launchers, plain jobs.

A course student has no root and no sudo: the README's set-up runs as a
plain user made for the test (`useradd`), from a copy of this checkout in
its own home, with Horovod's build headers hidden and cmake out of reach
(a mount namespace lays an overlay over /usr/include). Then, as that user:

* Horovod, built with MPI and Gloo, runs under `mpirun -np 2` on one
  machine and under `srun --mpi=pmix` across the two nodes of the real
  Slurm (`tests/slurm_cluster.py`), and both equal `horovodrun`'s ranks to
  the bound of the Horovod tests;
* the course scripts, submitted with `sbatch` as the docs say, complete,
  with everything they write owned by the user: the sync job with
  Horovod over ssh, `LAUNCHER=srun` and `LAUNCHER=mpirun`, and with
  `ENGINE=multi_worker` (loading a module through Lmod), and the async job;
* a node lost in the middle of a job (every process on it killed, slurmd
  too, back 30 s later) ends the job step, and the job requeues itself and
  completes from its last checkpoint.

Needs root (to make the user, the namespaces and the cluster) and the
packages `./setup.sh test` installs; skipped otherwise. One pytest worker
runs the module (CI's leg sets it), so the user is set up once.
"""

import csv
import glob
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from tests import engine_runs
from tests.data_files import batch_job_data
from tests.engine_runs import Spec, dumped_weights
from tests.helpers import ROOT, requires_horovod
from tests.slurm_cluster import (
    JOB_TIMEOUT,
    REQUEUE_FLAGS,
    SMALL,
    SlurmCluster,
    as_user,
    missing_programs,
    output_of,
    wait_for_output,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, requires_horovod]

# What the set-up must do without: Horovod's build headers (Debian's
# libfarmhash-dev, libhighwayhash-dev) and cmake; in the first run also
# the C++ compiler. Hidden by whiteouts in an overlay and by /dev/null
# bound over the programs.
HIDDEN_HEADERS = ("farmhash.h", "highwayhash")
HIDDEN_PROGRAMS = ("/usr/bin/cmake",)
COMPILERS = ("/usr/bin/g++-12", "/usr/bin/x86_64-linux-gnu-g++-12")
# The machine's pip settings (a local wheel of torch), as a user has them.
PIP_VARIABLES = (
    "PIP_FIND_LINKS", "PIP_CERT", "PIP_DEFAULT_TIMEOUT",
    "PIP_DISABLE_PIP_VERSION_CHECK",
)  # fmt: skip
SETUP_TIMEOUT = 1500
SBIN_PATH = os.environ["PATH"] + ":/usr/sbin:/sbin"
# A command prefix: a network namespace of its own with loopback up, where
# MPI's and Horovod's servers bind.
PRIVATE_NETWORK = ["unshare", "--net", "sh", "-c",
                   'ip link set lo up && exec "$@"', "sh"]  # fmt: skip


class Student:
    """The plain user: name, home, its clone, and its set-up's output."""

    def __init__(self, name, home):
        self.name, self.home = name, home
        self.repo = os.path.join(home, "tf-resnet")
        self.python = os.path.join(self.repo, ".venv", "bin", "python")
        self.setups = []  # (output, exit code, seconds) of each set-up run.

    def command(self, command):
        """`command` as this user, with a user's environment."""
        path = "/usr/local/bin:/usr/bin:/bin"
        pip = [f"{k}={os.environ[k]}" for k in PIP_VARIABLES if k in os.environ]
        return [
            "env", "-i", f"PATH={path}", "LANG=C.UTF-8", *pip,
            *as_user(self.name, command),
        ]  # fmt: skip

    def run(self, command, timeout=600, prefix=(), **kwargs):
        return subprocess.run(
            [*prefix, *self.command(command)], capture_output=True,
            text=True, timeout=timeout, **kwargs,
        )  # fmt: skip

    def owns_everything_under(self, folder):
        uid = int(subprocess.check_output(["id", "-u", self.name]))
        strangers = [
            os.path.join(parent, name)
            for parent, dirs, files in os.walk(folder)
            for name in dirs + files
            if os.lstat(os.path.join(parent, name)).st_uid != uid
        ]
        assert not strangers, strangers[:10]


def hiding(folder, compiler=False):
    """A command prefix: a mount namespace without the build's headers and
    cmake (and the C++ compiler if `compiler`)."""
    upper, work = os.path.join(folder, "upper"), os.path.join(folder, "work")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(upper)
    os.makedirs(work)
    for name in HIDDEN_HEADERS:
        os.mknod(os.path.join(upper, name), 0o600 | 0o020000, 0)  # Whiteout.
    programs = [*HIDDEN_PROGRAMS, *(COMPILERS if compiler else ())]
    mounts = [
        f"mount -t overlay overlay -o lowerdir=/usr/include,upperdir={upper},"
        f"workdir={work} /usr/include",
        *[f"mount --bind /dev/null {p}" for p in programs if os.path.exists(p)],
    ]
    return [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        " && ".join(mounts) + ' && exec "$@"', "sh",
    ]  # fmt: skip


def copy_checkout(target):
    """This checkout's files (tracked and new, not ignored), as a clone."""
    names = subprocess.check_output(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT
    ).split(b"\0")
    for name in filter(None, (n.decode() for n in names)):
        source = os.path.join(ROOT, name)
        if os.path.isfile(source):
            os.makedirs(
                os.path.dirname(os.path.join(target, name)), exist_ok=True
            )
            shutil.copy2(source, os.path.join(target, name))


@pytest.fixture(scope="module")
def world():
    """A folder every user may enter, removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("making a user and namespaces needs root")
    missing = [
        p for p in ("useradd", "runuser", "mpirun", "unshare")
        if not shutil.which(p, path=SBIN_PATH)
    ]  # fmt: skip
    missing += missing_programs()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (./setup.sh test)")
    folder = tempfile.mkdtemp(prefix="tf_resnet_user_")
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def student(world):
    """A plain user who cloned the project and ran the README's set-up.

    First without a C++ compiler: the set-up ends with a working
    environment and one line on what is missing. Then again with it: the
    headers come from Debian's archive into the cache, cmake from PyPI,
    and Horovod is built.
    """
    name = f"tfr{os.getpid() % 100000}"
    home = os.path.join(world, "home")
    subprocess.run(
        ["useradd", "--create-home", "--home-dir", home, "--shell",
         "/bin/bash", "--password", "*", name],
        check=True, env={**os.environ, "PATH": SBIN_PATH},
    )  # fmt: skip
    user = Student(name, home)
    try:
        copy_checkout(user.repo)
        subprocess.run(["chown", "-R", f"{name}:", home], check=True)
        # The keys horovodrun's ssh uses between the nodes (the home is
        # shared by every node, as on a cluster).
        keys = user.run(
            ["bash", "-c", "mkdir -p ~/.ssh && ssh-keygen -q -t ed25519 -N '' "
             "-f ~/.ssh/id_ed25519 && cat ~/.ssh/id_ed25519.pub >> "
             "~/.ssh/authorized_keys"],
        )  # fmt: skip
        assert keys.returncode == 0, keys.stderr
        for compiler in (True, False):
            started = time.monotonic()
            result = user.run(
                ["bash", "-c", "cd ~/tf-resnet && ./setup.sh env"],
                timeout=SETUP_TIMEOUT,
                prefix=hiding(os.path.join(world, "hidden"), compiler),
            )
            user.setups.append(
                (result.stdout + result.stderr, result.returncode,
                 time.monotonic() - started)
            )  # fmt: skip
        yield user
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        time.sleep(1)
        subprocess.run(
            ["userdel", name], check=False,
            env={**os.environ, "PATH": SBIN_PATH},
        )  # fmt: skip


def test_setup_without_root_or_compiler_finishes_without_horovod(student):
    output, code, _ = student.setups[0]
    assert code == 0, output[-5000:]
    assert "sudo" not in output, output[-3000:]
    (line,) = [
        line for line in output.splitlines() if "horovod not built" in line
    ]
    assert "no C++ compiler" in line and "module load" in line, line
    assert "Every engine but horovod works without it" in line, line


def test_a_second_setup_builds_horovod_with_mpi_as_the_user(student):
    output, code, seconds = student.setups[1]
    assert code == 0, output[-5000:]
    assert "sudo" not in output, output[-3000:]
    assert "fetching libfarmhash-dev libhighwayhash-dev" in output, output
    assert "cmake from PyPI" in output, output
    assert "horovod 0.28.1 installed (mpi-gloo)" in output, output
    # The environment was kept, not made again.
    assert "creating" not in output, output
    student.owns_everything_under(os.path.join(student.home, ".cache"))
    check = student.run(
        [student.python, "-c",
         "import horovod.tensorflow as hvd; hvd.init(); "
         "print(hvd.mpi_built(), hvd.gloo_built(), hvd.size())"],
        prefix=PRIVATE_NETWORK,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr[-3000:]
    assert check.stdout.split() == ["True", "True", "1"], check.stdout
    again = student.run(["bash", "-c", "cd ~/tf-resnet && ./setup.sh env"])
    assert again.returncode == 0, again.stderr
    assert "environment ready" in again.stderr, again.stderr
    assert "building" not in again.stderr, again.stderr
    print(f"non-root set-up: {[round(s) for _, _, s in student.setups]} s")


def horovodrun_reference():
    """Horovod's two ranks started by horovodrun (root, loopback)."""
    (run,) = engine_runs.equivalence_runs(Spec("horovod", ranks=2))
    return run


def readable_equivalence_flags():
    """The equivalence flags, their data made readable to the user."""
    flags = engine_runs.equivalence_flags(0.4)
    for path in engine_runs.equivalence_data().values():
        for folder in (
            os.path.dirname(path),
            os.path.dirname(os.path.dirname(path)),
        ):
            os.chmod(folder, 0o755)
    return flags


def user_dump_dir(student, name):
    folder = os.path.join(student.home, name)
    os.makedirs(folder)
    shutil.chown(folder, student.name)
    return folder


def assert_equal_to_horovodrun(dump_dir, output):
    reference = horovodrun_reference()
    for rank in (0, 1):
        engine_runs.assert_same_weights(
            dumped_weights(dump_dir, rank),
            reference.weights(),
            reference.weights(name="first"),
        )
    assert output.count("distribution horovod (started as one of 2 ranks") == 2


def test_mpirun_ranks_equal_horovodrun(student):
    """`mpirun -np 2` on one machine (a private network namespace), as the
    user: `auto` picks Horovod, which runs on MPI."""
    dump_dir = user_dump_dir(student, "mpirun")
    worker = os.path.join(student.repo, "tests", "hvd_worker.py")
    result = student.run(
        ["mpirun", "-np", "2", student.python, worker,
         f"--dump_dir={dump_dir}", f"--log_root={dump_dir}/log",
         *readable_equivalence_flags()],
        prefix=PRIVATE_NETWORK,
        cwd=student.repo,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "(OMPI_COMM_WORLD_SIZE)" in output, output[-3000:]
    assert_equal_to_horovodrun(dump_dir, output)


@pytest.fixture(scope="module")
def cluster(world):
    slurm = SlurmCluster(tempfile.mkdtemp(prefix="slurm_", dir=world))
    slurm.start()
    try:
        yield slurm
    finally:
        slurm.stop()


def test_srun_mpi_ranks_across_nodes_equal_horovodrun(cluster, student):
    """`srun --mpi=pmix`, one task per node, as the user: PMIx starts the
    MPI ranks, no ssh; Horovod's MPI talks over the bridge."""
    dump_dir = user_dump_dir(student, "srun")
    worker = os.path.join(student.repo, "tests", "hvd_worker.py")
    result = cluster.run(
        as_user(
            student.name,
            ["srun", "--mpi=pmix", "--nodes=2", "--ntasks-per-node=1",
             "--kill-on-bad-exit=1", student.python, worker,
             f"--dump_dir={dump_dir}", f"--log_root={dump_dir}/log",
             *readable_equivalence_flags()]
        ),
        check=False, cwd=student.repo, timeout=400,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    hosts = re.findall(r"process \d+ on host (\S+):", output)
    assert sorted(hosts) == ["node1", "node2"], output[-3000:]
    assert "PMIX_RANK, srun --mpi=pmix" in output, output[-3000:]
    assert_equal_to_horovodrun(dump_dir, output)


@pytest.fixture(scope="module")
def data(world):
    folder = os.path.join(world, "data")
    os.makedirs(folder)
    files = batch_job_data(pathlib.Path(folder))
    for parent, dirs, _ in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(parent, name), 0o755)
    return files


# name: (script, environment); each job with one task slot per node.
USER_JOBS = {
    "horovod_ssh": (
        "slurm/course_sync_cifar100.sbatch",
        {"HOROVOD_FLAGS": "--network-interface eth0"},
    ),
    "horovod_srun_mpi": (
        "slurm/course_sync_cifar100.sbatch", {"LAUNCHER": "srun"},
    ),
    "horovod_mpirun": (
        "slurm/course_sync_cifar100.sbatch", {"LAUNCHER": "mpirun"},
    ),
    "multi_worker_with_a_module": (
        "slurm/course_sync_cifar100.sbatch",
        {"ENGINE": "multi_worker", "MODULES": "tfr-course"},
    ),
    "parameter_server": ("slurm/course_async_cifar100.sbatch", {}),
}  # fmt: skip


def submit_as(cluster, student, data, name, script, env, flags=SMALL):
    """Submits `script` as the user, from a folder of its home."""
    submit_dir = os.path.join(student.home, "jobs", name)
    subprocess.run(student.command(["mkdir", "-p", submit_dir]), check=True)
    env = {
        "TRAIN_DATA": data["TRAIN_DATA"], "EVAL_DATA": data["EVAL_DATA"],
        "EXTRA_FLAGS": flags,
        "MODULEPATH": os.path.join(student.home, "modulefiles"), **env,
    }  # fmt: skip
    # sbatch from the user's clone, as the docs say: REPO is the clone.
    job = cluster.sbatch(
        os.path.join(student.repo, "scripts", script), cwd=submit_dir,
        env={**env, "REPO": student.repo}, args=("--ntasks-per-node=1",),
        user=student.name,
    )  # fmt: skip
    return job, submit_dir


def write_module(student):
    """An Lmod module file in the user's MODULEPATH."""
    folder = os.path.join(student.home, "modulefiles", "tfr-course")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "1.0.lua"), "w") as stream:
        stream.write('setenv("TF_RESNET_COURSE_MODULE", "1.0")\n')
    subprocess.run(
        [
            "chown",
            "-R",
            f"{student.name}:",
            os.path.join(student.home, "modulefiles"),
        ],
        check=True,
    )


def test_course_scripts_complete_as_a_plain_user(cluster, student, data):
    """Every form of the course's multi-node jobs, submitted together."""
    write_module(student)
    jobs = {
        name: submit_as(cluster, student, data, name, script, env)
        for name, (script, env) in USER_JOBS.items()
    }
    failures = []
    for name, (job, submit_dir) in jobs.items():
        record = cluster.wait(job, JOB_TIMEOUT)
        text = output_of(submit_dir)
        if record["JobState"] != "COMPLETED":
            failures.append(f"{name}: {record['JobState']}\n{text[-4000:]}")
            continue
        runs = glob.glob(os.path.join(student.home, "runs", f"*-{job}"))
        assert len(runs) == 1, (name, runs, text[-3000:])
        run = runs[0]
        with open(os.path.join(run, "eval.csv")) as stream:
            assert int(list(csv.DictReader(stream))[-1]["step"]) == 2, name
        hosts = set(re.findall(r"process \d+ on host (\S+):", text))
        assert hosts == {"node1", "node2"}, (name, text[-3000:])
        student.owns_everything_under(run)
        student.owns_everything_under(submit_dir)
    assert not failures, "\n\n".join(failures)
    text = output_of(jobs["multi_worker_with_a_module"][1])
    assert "modules loaded: tfr-course" in text, text[-3000:]
    # The preset names the engine; Horovod's ranks then talk MPI (srun
    # sets no horovodrun rendezvous).
    text = output_of(jobs["horovod_srun_mpi"][1])
    assert "2 ranks on node1:1,node2:1 (srun)" in text, text[-3000:]
    assert text.count("distribution horovod (") == 2, text[-3000:]
    text = output_of(jobs["horovod_mpirun"][1])
    assert "2 ranks on node1:1,node2:1 (mpirun)" in text, text[-3000:]
    assert text.count("distribution horovod (") == 2, text[-3000:]


def test_a_lost_node_requeues_the_job_which_resumes(cluster, student, data):
    """Every process on node2 killed at step 16, slurmd and sshd too, back
    30 s later (as the issue tried): node1's worker exits 4, the job step
    ends, the job requeues itself and completes from its last checkpoint."""
    job, submit_dir = submit_as(
        cluster, student, data, "lost_node",
        "slurm/course_sync_cifar100.sbatch", {"ENGINE": "multi_worker"},
        flags=REQUEUE_FLAGS,
    )  # fmt: skip
    wait_for_output(submit_dir, r"step 16/60", timeout=400)
    cluster.kill_node("node2")
    killed = time.monotonic()
    time.sleep(30)
    cluster.start_node("node2")
    while cluster.job(job).get("Restarts", "0") == "0":
        assert time.monotonic() - killed < 180, output_of(submit_dir)[-5000:]
        time.sleep(1)
    print(f"requeued {time.monotonic() - killed:.0f} s after the kill")
    record = cluster.wait(job, JOB_TIMEOUT)
    text = output_of(submit_dir)
    assert record["JobState"] == "COMPLETED", text[-5000:]
    assert cluster.job(job)["Restarts"] == "1", cluster.job(job)
    assert "exited with code 4" in text, text[-5000:]
    assert "a task lost its peers (exit 4): requeueing" in text, text[-5000:]
    resumed = re.findall(r"resumed from \S+ckpt-(\d+) at step \d+", text)
    assert len(resumed) == 2 and len(set(resumed)) == 1, text[-5000:]
    assert int(resumed[0]) >= 14, resumed  # Every 7 steps: none lost before.

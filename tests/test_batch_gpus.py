"""The batch scripts' GPU requests agree with the device plan they produce.

Each Slurm and PBS script runs as the scheduler would run it on the
allocation its header asks for (2 nodes as 127.0.0.1 and 127.0.0.2), with
every `resnet_main.py` replaced by a recorder: it notes its flags and
environment (and a server task listens on its port, so the job goes on).
`horovodrun`, `srun`, `scontrol` and `pbsdsh` are stand-ins that start
processes with the variables the real ones set. Then each recorded process
is given to the real config, engine registry and device plan, on a node
with the header's GPU count: every process that computes must get its own
GPU(s), and (but for the parameter servers' slots) every GPU asked for
must be used. What only a GPU machine shows is left to
scripts/gpu_check.sh.
"""

import glob
import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest
from absl import flags

from tests.helpers import IN_PRIVATE_NETWORK, ROOT
from tf_resnet import detect
from tf_resnet.config import flags as resnet_flags
from tf_resnet.engines import devices, startup

HOSTS = ("127.0.0.1", "127.0.0.2")
# Variables a recorded process keeps: the launchers' and schedulers'.
PREFIXES = ("SLURM_", "HOROVOD_", "PBS_", "CUDA_", "LOCAL_", "OMPI_", "FAKE_")

RECORDER = """
import json, os, socket, sys, time, uuid
args = sys.argv[2:]
env = {k: v for k, v in os.environ.items() if k.startswith(PREFIXES)}
path = os.path.join(os.environ["RECORDS"], uuid.uuid4().hex + ".json")
with open(path, "w") as stream:
    json.dump({"argv": args, "env": env}, stream)
given = dict(a[2:].split("=", 1) for a in args if "=" in a)
job = given.get("job_name")
if job in ("ps", "worker"):  # Serve, as a server task does, until killed.
    address = given[job + "_hosts"].split(",")[int(given["task_index"])]
    host, port = address.rsplit(":", 1)
    server = socket.create_server((host, int(port)))
    while True:
        time.sleep(60)
"""

STAND_INS = {
    "horovodrun": """
        #!/bin/bash
        # horovodrun -np N -H host:slots,... [flags] COMMAND: one rank per
        # slot, with the variables horovodrun gives each.
        while [[ $1 == -* ]]; do
          case $1 in
            -np) np=$2; shift 2 ;;
            -H) hosts=$2; shift 2 ;;
            *) shift ;;
          esac
        done
        rank=0
        IFS=, read -ra items <<<"$hosts"
        for item in "${items[@]}"; do
          host=${item%:*} slots=${item##*:}
          for ((j = 0; j < slots; j++)); do
            HOROVOD_RANK=$rank HOROVOD_SIZE=$np HOROVOD_LOCAL_RANK=$j \\
              HOROVOD_LOCAL_SIZE=$slots FAKE_NODE=$host "$@" || exit
            rank=$((rank + 1))
          done
        done
    """,
    "srun": """
        #!/bin/bash
        # srun --ntasks=N ... COMMAND: N tasks, block-distributed over the
        # nodes, with the variables srun gives each; waits for all.
        ntasks=$SLURM_NTASKS
        while [[ $1 == -* ]]; do
          [[ $1 == --ntasks=* ]] && ntasks=${1#*=}
          shift
        done
        per_node=$((ntasks / SLURM_JOB_NUM_NODES))
        pids=()
        for ((i = 0; i < ntasks; i++)); do
          SLURM_PROCID=$i SLURM_LOCALID=$((i % per_node)) \\
            SLURM_NODEID=$((i / per_node)) SLURM_STEP_NUM_TASKS=$ntasks \\
            SLURM_STEP_TASKS_PER_NODE=$SLURM_TASKS_PER_NODE \\
            FAKE_NODE=$((i / per_node)) "$@" &
          pids+=($!)
        done
        # srun ends its tasks with SIGKILL when it is stopped.
        trap 'kill -KILL "${pids[@]}" 2>/dev/null' TERM INT
        wait
    """,
    "scontrol": """
        #!/bin/bash
        tr , '\\n' <<<"$3"
    """,
    "pbsdsh": """
        #!/bin/bash
        # pbsdsh -n SLOT -- COMMAND: the command on that node-file slot.
        export PBS_VNODENUM=$2
        export FAKE_NODE=$(sed -n "$(($2 + 1))p" "$PBS_NODEFILE")
        shift 2
        [[ $1 == -- ]] && shift
        exec "$@"
    """,
}


def header(path):
    """`(nodes, tasks per node, GPUs per node)` the script asks for."""
    with open(path) as stream:
        text = stream.read()
    if path.endswith(".pbs"):
        nodes, ppn, gpus = re.search(
            r"^#PBS -l nodes=(\d+):ppn=(\d+):gpus=(\d+)$", text, re.M
        ).groups()
        return int(nodes), int(ppn), int(gpus)

    def value(name):
        return int(re.search(rf"^#SBATCH --{name}=(\d+)$", text, re.M)[1])

    return value("nodes"), value("ntasks-per-node"), value("gpus-per-node")


def scheduler_env(path, home):
    nodes, tasks, gpus = header(path)
    hosts = HOSTS[:nodes]
    if path.endswith(".pbs"):
        # One node, the batch shell's: its GPU file names this host.
        hosts = hosts if nodes > 1 else (socket.gethostname(),)
        nodefile = home / "nodefile"
        nodefile.write_text("".join(f"{h}\n" * tasks for h in hosts))
        gpufile = home / "gpufile"
        gpufile.write_text(
            "".join(f"{h}-gpu{g}\n" for h in hosts for g in range(gpus))
        )
        return {
            "PBS_JOBID": "77.server", "PBS_NODEFILE": str(nodefile),
            "PBS_GPUFILE": str(gpufile), "PBS_O_WORKDIR": ROOT,
        }  # fmt: skip
    return {
        "SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": ROOT,
        "SLURM_JOB_NODELIST": ",".join(hosts),
        "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS": str(nodes * tasks),
        "SLURM_NTASKS_PER_NODE": str(tasks),
        "SLURM_TASKS_PER_NODE": f"{tasks}(x{nodes})",
        "SLURM_GPUS_ON_NODE": str(gpus),
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
    }  # fmt: skip


def run_script(path, home, engine=None):
    """Runs the batch script with recorders; returns the records."""
    bin_dir = home / "bin"
    bin_dir.mkdir()
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text(textwrap.dedent(text).lstrip())
        (bin_dir / name).chmod(0o755)
    recorder = bin_dir / "python"
    recorder.write_text(
        f"#!{sys.executable}\nPREFIXES = {PREFIXES!r}\n{RECORDER}"
    )
    recorder.chmod(0o755)
    records = home / "records"
    records.mkdir()
    # The files the jobs check for before they start (the recorder reads
    # none of them).
    data = home / "datasets"
    for name in ("cifar-100-binary/train.bin", "cifar-100-binary/test.bin",
                 "cifar-10-batches-bin/test_batch.bin",
                 "tiny-imagenet-200/train", "resnet18.pth"):  # fmt: skip
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).touch()
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(home),
        "DATA_ROOT": str(data),
        "PRETRAINED": str(data / "resnet18.pth"),
        "PYTHONPATH": ROOT,
        "PYTHON": str(recorder),
        "RECORDS": str(records),
        "START_TIMEOUT": "30",
        **({"ENGINE": engine} if engine else {}),
        **scheduler_env(path, home),
    }
    proc = subprocess.run(
        [sys.executable, "-c", IN_PRIVATE_NETWORK, path],
        cwd=home, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = sorted(glob.glob(str(records / "*.json")))
    records = []
    for name in found:
        with open(name) as stream:
            records.append(json.load(stream))
    return records


def planned(record, gpus, monkeypatch):
    """The device plan of a recorded process on a node with `gpus` GPUs."""
    for name in list(os.environ):
        if name.startswith(PREFIXES) or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    for name, value in record["env"].items():
        monkeypatch.setenv(name, value)
    values = flags.FlagValues()
    resnet_flags.define_all(values)
    values(["resnet_main.py", *record["argv"]])
    config = resnet_flags.config_from_flags(values)
    dist = config.distribution
    engine, _ = startup.resolve(dist.distribution, dist)
    node = devices.Node(
        tuple(str(g) for g in range(gpus)),
        *detect.local_process(dist.task_index),
    )
    job = detect.server_job(dist.job_name)
    plan = devices.plan(
        startup.devices_rule(engine),
        dist.num_gpus,
        dist.cpu_replicas,
        node,
        job,
    )
    computes = not (engine == "parameter_server" and job != "worker")
    return record["env"].get("FAKE_NODE", "batch"), computes, plan


SCRIPTS = [
    *(("slurm", f"slurm/{n}.sbatch", None) for n in (
        "course_cifar100", "course_tinyimagenet", "resnet18_cifar100",
        "course_async_cifar100")),
    ("slurm", "slurm/course_sync_cifar100.sbatch", "horovod"),
    ("slurm", "slurm/course_sync_cifar100.sbatch", "multi_worker"),
    ("slurm", "train_horovod.slurm", None),
    *(("pbs", f"pbs/{n}.pbs", None) for n in (
        "course_cifar100", "course_tinyimagenet", "resnet18_cifar100",
        "course_async_cifar100")),
    ("pbs", "pbs/course_sync_cifar100.pbs", "horovod"),
    ("pbs", "pbs/course_sync_cifar100.pbs", "multi_worker"),
    ("pbs", "train_horovod.pbs", None),
]  # fmt: skip


@pytest.mark.parametrize("scheduler, script, engine", SCRIPTS)
def test_the_gpus_asked_for_are_the_gpus_used(
    scheduler, script, engine, tmp_path, monkeypatch
):
    path = os.path.join(ROOT, "scripts", script)
    nodes, tasks, gpus = header(path)
    records = run_script(path, tmp_path, engine)
    plans = [planned(record, gpus, monkeypatch) for record in records]
    used = {}
    for node, computes, plan in plans:
        if not computes:
            assert plan.gpus == (), (node, plan)
            continue
        assert plan.gpus, f"a process on {node} trains on the CPU: {plan}"
        assert not used.setdefault(node, set()) & set(plan.gpus), plans
        used[node] |= set(plan.gpus)
    asynchronous = "async" in script
    if not asynchronous:  # Each node's GPUs, all of them, no more.
        assert len(used) == nodes, plans
        assert all(g == set(range(gpus)) for g in used.values()), plans
    # One process per task slot, plus the coordinator of the async job.
    assert len(records) == (nodes * tasks if nodes > 1 else 1) + asynchronous

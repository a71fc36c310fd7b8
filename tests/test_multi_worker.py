"""`--distribution=multi_worker` on two real worker processes over loopback.

The training tests start the workers through
`tf_resnet.launch.tf_config_cluster` (a loopback-only network namespace,
`TF_CONFIG` per worker) running
`tests/hvd_worker.py`, which is `resnet_main.py` plus small models and
dumps of each worker's weights. The test of a lost peer starts the two
workers itself, in a namespace of its own, to watch the survivor alone.

The equivalence runs once, on the pinned set (`on_one_set`, beside the
Horovod runs whose one-process reference it shares; on the newest set the
Ray cluster test runs multi_worker workers against one process and
through a restart); the resume and a refused run, once on the newest set
(`on_newest_set`, for CI's budget); how a lost peer ends the other, which
is TensorFlow's collectives' doing, is tested on both sets.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests import engine_runs
from tests.engine_runs import Spec, dumped_weights
from tests.helpers import (
    ROOT,
    on_newest_set,
    on_one_set,
    resnet8_flags,
    run_python,
)
from tf_resnet import detect, log_root_lock, runtime
from tf_resnet.config import settings, validation
from tf_resnet.distribute import multi_worker
from tf_resnet.engines import startup
from tf_resnet.errors import UserInputError
from tf_resnet.launch import tf_config_cluster as launcher

WORKER = engine_runs.WORKER


def launch(dump_dir, flags, workers=2, **env):
    """Starts the launcher (`env`: variables for it and its workers)."""
    os.makedirs(dump_dir, exist_ok=True)
    command = [
        sys.executable, "-m", "tf_resnet.launch.tf_config_cluster",
        f"--np={workers}", f"--main={WORKER}", "--",
        f"--dump_dir={dump_dir}", *flags,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, env=engine_runs.worker_env(**env), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def finish(process, timeout=240):
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


@on_one_set
def test_two_workers_train_exactly_like_one_process():
    # engine_runs' equivalence setup: the workers read strides of the one
    # process's permutation, and no crop or flip changes the model, so both
    # runs see the same examples each step. The one process is the run the
    # Horovod and averaging tests compare with too, trained once per pytest
    # worker (engine_runs caches it).
    single, cluster = engine_runs.equivalence_runs(
        Spec("default"), Spec("multi_worker", 2, launcher="tf_config_cluster")
    )
    expected = single.weights()
    worker0, worker1 = cluster.weights(0), cluster.weights(1)
    for ours, theirs in zip(worker0, worker1, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    # Float32 sums in another order: equal to 1e-4 of what training moved.
    engine_runs.assert_same_weights(
        worker0, expected, single.weights(name="first")
    )
    assert "global batch 16 over 2 replica(s) (multi_worker)" in cluster.output


@on_one_set
def test_packing_changes_nothing_and_float16_gradients_stay_close():
    # Beside the equivalence run above, whose two-worker run it reuses.
    plain, packed, compressed = engine_runs.equivalence_runs(
        *(
            Spec("multi_worker", 2, extra=extra, launcher="tf_config_cluster")
            for extra in (
                (),
                ("--all_reduce_pack_bytes=64",),
                ("--gradient_compression=fp16",),
            )
        )
    )
    first = plain.weights(name="first")
    # TensorFlow's line of the gradient all-reduce (4 tensors), which 64
    # bytes split.
    packs = r"Collective all_reduce tensors: 4 all_reduces, .* num_packs = "
    assert re.search(packs + "1$", plain.output, re.M), plain.output[-3000:]
    assert re.search(packs + "2$", packed.output, re.M), packed.output[-3000:]
    # Two workers' sums do not depend on how the tensors are packed.
    engine_runs.assert_same_weights(packed.weights(), plain.weights(), first, 0)
    # float16 sums: close to float32's, but not equal (or nothing was cast);
    # an all-reduce done twice (doubled gradients) would be far off.
    difference, _ = engine_runs.assert_same_weights(
        compressed.weights(), plain.weights(), first, 1e-2
    )
    assert difference > 0
    for ours, theirs in zip(
        compressed.weights(0), compressed.weights(1), strict=True
    ):
        np.testing.assert_array_equal(ours, theirs)


@on_one_set
@pytest.mark.parametrize("knob", [(), ("--accumulate_steps=2",)])
def test_packs_overlapped_sum_as_one_pack(knob):
    """Packs of 64 bytes (overlapped) against one pack after the backward
    pass, with and without accumulation: the same two gradients added."""
    overlapped, one_pack = engine_runs.equivalence_runs(
        *(
            Spec("multi_worker", 2, extra=(*extra, *knob),
                 launcher="tf_config_cluster")
            for extra in (
                ("--all_reduce_pack_bytes=64",),
                ("--nooverlap_all_reduce",),
            )
        )
    )  # fmt: skip
    assert "gradient all-reduce: 2 bucket(s)" in overlapped.output
    assert "gradient all-reduce: one pack after" in one_pack.output
    engine_runs.assert_same_weights(
        overlapped.weights(),
        one_pack.weights(),
        one_pack.weights(name="first"),
        rtol=0,
    )


MIRRORED_FP16 = """
import keras, tensorflow as tf
from tf_resnet import runtime
from tf_resnet.runtime import distributor_for
from tf_resnet.config.settings import DistributionConfig
dist = DistributionConfig(gradient_compression="fp16")
mode = distributor_for("mirrored", 2, dist, runtime.configure_devices(0, 2))
# Each replica's gradient: float16 rounds 1 + 2**-12 to 1, 2**-30 to 0.
grad = tf.constant([1 + 2**-12, 2**-30])
for compressed in (False, True):
    with mode.scope():
        weight = keras.Variable([0.0, 0.0])
        optimizer = keras.optimizers.SGD(1.0)  # Update: -(sum of grads).
        optimizer.build([weight])
    if compressed:  # As `builders.build_optimizer` does.
        mode.prepare_optimizer(optimizer)
    # Each replica's own tensor (one tensor of both would be taken for a
    # mirrored value, which the all-reduce does not sum).
    step = tf.function(lambda: mode.strategy.run(
        lambda: optimizer.apply_gradients([(tf.identity(grad), weight)])))
    step()
    print(compressed, *weight.numpy().tolist())
"""


def test_float16_compression_of_the_optimizers_all_reduce():
    """What multi_worker and mirrored share, on 2 logical CPUs of mirrored.

    Keras' optimizer all-reduces the gradients itself: compressed, it sums
    float16 copies, once.
    """
    lines = run_python(MIRRORED_FP16).splitlines()[-2:]
    sums = {
        name: [float(x) for x in rest] for name, *rest in map(str.split, lines)
    }
    assert sums == {
        "False": [-2 - 2**-11, -(2**-29)],
        "True": [-2.0, 0.0],
    }


@pytest.mark.slow
@on_newest_set
def test_bn_statistics_agree_and_a_second_run_resumes(
    synthetic_cifar, tmp_path
):
    log_root = tmp_path / "log"
    # ResNet-8 has BatchNorm: its moving statistics must agree, and so
    # must the moving averages of the weights.
    flags = resnet8_flags(
        synthetic_cifar,
        log_root,
        "--train_steps=12",
        "--steps_per_run=6",
        "--log_every_steps=3",
        "--dtype=float32",
        "--ema_decay=0.9",
    )
    first_dump, second_dump = tmp_path / "first", tmp_path / "second"
    # The workers' own temporary folder: a killed worker of another run
    # (a test that kills one) leaves its scratch in the machine's.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    code, output = finish(launch(first_dump, flags, TMPDIR=str(temporary)))
    assert code == 0, output[-3000:]
    assert os.path.exists(log_root / "ckpt-6.index")
    # Only the chief keeps a checkpoint and writes the run's files.
    assert (first_dump / "saves_rank0.txt").read_text().split() == [
        str(log_root / "ckpt-6")
    ]
    assert not (first_dump / "writes_rank1.txt").exists()
    # Worker 1 took part in the save into a scratch directory, now gone.
    assert not list(temporary.glob("tf_resnet_worker1_*"))

    code, output = finish(launch(second_dump, flags))
    assert code == 0, output[-3000:]
    assert len(re.findall(r"resumed from \S+ckpt-6 at step 6\b", output)) == 2
    # Each worker evaluates its half; the counts add up, and the chief alone
    # says so (the other worker's line would repeat it).
    assert output.count("eval at step 12: precision") == 1
    assert output.count("over 200 examples") == 1
    worker0, worker1 = (
        dumped_weights(second_dump, 0),
        dumped_weights(second_dump, 1),
    )
    assert len(worker0) > 30  # Kernels, BN scale/offset/mean/variance.
    for ours, theirs in zip(worker0, worker1, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    ema0, ema1 = (
        dumped_weights(second_dump, 0, "ema"),
        dumped_weights(second_dump, 1, "ema"),
    )
    assert len(ema0) == len(worker0)
    for ours, theirs in zip(ema0, ema1, strict=True):
        np.testing.assert_array_equal(ours, theirs)


SURVIVOR = """
import json, os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from tf_resnet.launch import private_network, tf_config_cluster
private_network.enter_private_network()
sig, dump_dir, flags = getattr(signal, sys.argv[2]), sys.argv[3], sys.argv[4:]
main = os.path.join(sys.argv[1], "tests", "hvd_worker.py")
commands = tf_config_cluster.worker_commands(
    main, [f"--dump_dir={dump_dir}", *flags], 2
)
workers = [subprocess.Popen(c, env=e) for c, e in commands.values()]
pid_file = os.path.join(dump_dir, "pid_rank1.txt")
deadline = time.monotonic() + 180
while not os.path.exists(pid_file) and time.monotonic() < deadline:
    time.sleep(0.2)
workers[1].send_signal(sig)
killed = time.monotonic()
try:
    code = workers[0].wait(timeout=120)
except subprocess.TimeoutExpired:
    workers[0].kill()
    code = None
workers[1].kill()
print(json.dumps({"code": code, "secs": time.monotonic() - killed}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_a_lost_worker_makes_the_other_fail_not_hang(
    synthetic_cifar, tmp_path, signal_name
):
    # SIGKILL resets the connection; SIGSTOP leaves it open and silent, so
    # only --peer_timeout_secs ends the survivor's wait.
    flags = resnet8_flags(
        synthetic_cifar,
        tmp_path / "log",
        "--train_steps=100000",
        "--peer_timeout_secs=15",
    )
    result = subprocess.run(
        [
            sys.executable, "-c", textwrap.dedent(SURVIVOR), ROOT,
            signal_name, str(tmp_path), *flags,
        ],
        cwd=ROOT, env=engine_runs.worker_env(), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # resnet_main's exit code for a lost task of the cluster.
    assert report["code"] == 4, result.stderr[-3000:]
    assert report["secs"] < 60, report
    assert "lost a task of the training cluster" in result.stderr


@on_newest_set
def test_a_refused_run_is_said_by_every_worker_not_as_a_lost_task(
    synthetic_cifar, tmp_path
):
    # Another live run (this test's process, on this host) holds the lock.
    log_root = tmp_path / "log"
    log_root.mkdir()
    flags = resnet8_flags(synthetic_cifar, log_root, "--train_steps=4")
    with log_root_lock.hold(str(log_root)):
        code, output = finish(launch(tmp_path / "dump", flags), timeout=180)
    assert code == 2, output[-3000:]
    assert f"in use by the run of process {os.getpid()}" in output
    assert re.search(
        r"^resnet_main: error: the chief refused the run at "
        rf"--log_root={log_root} \(its error line says why\)",
        output,
        re.M,
    ), output[-3000:]
    assert "lost a task" not in output, output[-3000:]
    assert (
        output.strip()
        .splitlines()[-1]
        .startswith("launch.tf_config_cluster: worker 0 at ")
    ), output[-3000:]


def test_the_launcher_ends_with_the_first_failed_worker(
    synthetic_cifar, tmp_path
):
    flags = resnet8_flags(
        synthetic_cifar, tmp_path / "log", "--train_steps=100000"
    )
    process = launch(tmp_path, flags)
    # Killed while it starts: the launcher need not wait for training.
    for line in process.stdout:
        started = re.search(r"started worker 1 at \S+ \(pid (\d+)\)", line)
        if started:
            break
    os.kill(int(started[1]), 9)
    killed = time.monotonic()
    code, output = finish(process, timeout=60)
    assert code == 128 + 9, output[-3000:]
    assert time.monotonic() - killed < 30
    assert re.search(r"worker 1 at \S+ exited with code -9", output)


def test_cluster_from_flags(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"ps": ["a:1"]}}))
    resolver = multi_worker.cluster_resolver(["h0:1", "h1:2"], 1)
    assert resolver.cluster_spec().as_dict() == {"worker": ["h0:1", "h1:2"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    with pytest.raises(UserInputError, match="--task_index=2 is not in"):
        multi_worker.cluster_resolver(["h0:1", "h1:2"], 2)


def test_cluster_from_tf_config(monkeypatch):
    cluster = {"worker": ["w:1", "w:2", "w:3"]}
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": 2}}
        ),
    )
    resolver = multi_worker.cluster_resolver()
    assert resolver.cluster_spec().as_dict() == cluster
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)
    assert multi_worker._worker_index(resolver) == 2
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps({"cluster": {**cluster, "ps": ["p:1"]}, "task": {}}),
    )
    with pytest.raises(UserInputError, match="no ps"):
        multi_worker.cluster_resolver()
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": 3}}
        ),
    )
    with pytest.raises(UserInputError, match="is not in the cluster"):
        multi_worker.cluster_resolver()


def test_cluster_from_slurm(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "3")
    with pytest.raises(UserInputError, match="SLURM_STEP_NUM_TASKS"):
        multi_worker.cluster_resolver()
    for name, value in (
        ("SLURM_STEP_NUM_TASKS", "4"),
        ("SLURM_STEP_NODELIST", "node[1-2]"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
        ("SLURM_JOB_ID", "4242"),
    ):
        monkeypatch.setenv(name, value)
    resolver = multi_worker.cluster_resolver()
    # The job's own ports, 10000 + 100 * (4242 mod 200), as the batch
    # scripts': two jobs on one node must not share a port.
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["node1:14200", "node1:14201", "node2:14200", "node2:14201"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)


def test_job_ports_stay_below_the_ports_of_outgoing_connections(monkeypatch):
    """Linux gives outgoing connections local ports from 32768 up (the
    default `ip_local_port_range`): a server there can find its port taken.
    """
    for job_id in (0, 199, 4242, 1234567):
        monkeypatch.setenv("SLURM_JOB_ID", str(job_id))
        base = detect.slurm_job_port()
        assert base >= 10000 and base + 99 < 32768, job_id


def test_no_cluster_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    with pytest.raises(UserInputError, match="needs a cluster"):
        multi_worker.cluster_resolver()


def test_auto_picks_multi_worker_in_a_tf_config_cluster_without_ps(
    monkeypatch,
):
    for name in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    workers = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(workers))
    assert startup.resolve("auto") == (
        "multi_worker",
        "TF_CONFIG names 2 workers, no ps",
    )
    one = {"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(one))
    assert startup.resolve("auto")[0] == "auto"
    with_ps = {"cluster": {"worker": ["a:1", "b:2"], "ps": ["c:3"]}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(with_ps))
    assert startup.resolve("auto")[0] == "parameter_server"


def test_start_line_names_the_preset_that_chose_the_mode(monkeypatch):
    for name in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    preset = "course_async_cifar100"
    ps = settings.make_config(preset=preset, distribution="parameter_server")
    assert runtime.named_by(ps) == f"--preset={preset}"
    assert startup.resolve("parameter_server", None, runtime.named_by(ps)) == (
        "parameter_server",
        f"--preset={preset}",
    )
    sync = settings.make_config(preset=preset, distribution="multi_worker")
    assert runtime.named_by(sync) == "--distribution"


@pytest.mark.parametrize(
    "values, message",
    [
        ({"ps_hosts": ["a:1"]}, "has no ps and no job names"),
        ({"cpu_replicas": 2}, "--cpu_replicas is for"),
        ({"peer_timeout_secs": 0}, "must be positive"),
    ],
)
def test_contradictory_flags(values, message):
    config = settings.make_config(
        distribution="multi_worker",
        train_data_path="x",
        eval_data_path="y",
        **values,
    )
    with pytest.raises(UserInputError, match=message):
        validation.validate(config)


def test_launcher_gives_each_worker_its_tf_config():
    args = launcher.parse_args(["--np=3", "--", "--model=resnet32"])
    assert (args.np, args.network, args.main_flags) == (
        3,
        "private",
        ["--model=resnet32"],
    )
    commands = launcher.worker_commands("main.py", ["--model=resnet32"], 3)
    configs = [json.loads(env["TF_CONFIG"]) for _, env in commands.values()]
    hosts = configs[0]["cluster"]["worker"]
    assert len(set(hosts)) == 3
    assert [c["task"] for c in configs] == [
        {"type": "worker", "index": i} for i in range(3)
    ]
    assert all(c["cluster"] == {"worker": hosts} for c in configs)
    command, _ = next(iter(commands.values()))
    assert command[-2:] == ["--model=resnet32", "--distribution=multi_worker"]
    with pytest.raises(SystemExit):
        launcher.parse_args(["--np=0", "--"])


def test_launcher_refuses_a_mode_its_workers_cannot_run(capsys):
    with pytest.raises(SystemExit):
        launcher.parse_args(["--np=2", "--", "--distribution", "horovod"])
    error = capsys.readouterr().err
    assert "--distribution=horovod: these workers run" in error


def test_launcher_advice_after_a_failed_worker():
    advice = launcher.resume_advice(["--log_root", "/runs/a", "--model=x"])
    assert advice(137) == (
        "rerun the same command to resume from the latest checkpoint in "
        "--log_root=/runs/a (or from the start if there is none)"
    )
    assert "in its --log_root" in launcher.resume_advice([])(4)
    assert advice(2) == advice(3) == "its error line above says why"

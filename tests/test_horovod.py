"""`--distribution=horovod` on two real ranks over loopback (gloo).

The training tests launch `horovodrun -np 2 -H localhost:2 --gloo` through
`tf_resnet.launch.horovod`, in a loopback-only network namespace (see
engine_runs.py); none is skipped, as the CI machine has Horovod.
"""

import os
import pathlib
import re
import signal
import time

import numpy as np
import pytest

from tests import engine_runs
from tests.engine_runs import Spec
from tests.helpers import (
    load_data_script,
    requires_horovod,
    run_main,
    run_python,
)
from tf_resnet.config.settings import DistributionConfig
from tf_resnet.errors import UserInputError
from tf_resnet.runtime import distributor_for

make_synthetic_cifar = load_data_script("make_synthetic_cifar")

pytestmark = requires_horovod


@pytest.fixture(scope="module")
def shapes_files(tmp_path_factory):
    """64 learnable training images (one file) and 40 evaluation images."""
    folder = tmp_path_factory.mktemp("shapes")
    paths = {}
    for name, count, seed in (("train", 64, 1), ("test", 40, 2)):
        images, labels = make_synthetic_cifar.make_images(count, seed)
        paths[name] = str(folder / f"{name}.bin")
        with open(paths[name], "wb") as stream:
            stream.write(make_synthetic_cifar.to_records(images, labels))
    return paths


def logged_losses(output, rank=0):
    return [
        float(match)
        for match in re.findall(
            rf"\[{rank}\]<stderr>:.*step \d+/\d+ .*?: loss ([\d.]+)", output
        )
    ]


def test_two_ranks_train_to_identical_models(shapes_files):
    flags = [
        f"--train_data_path={shapes_files['train']}",
        f"--eval_data_path={shapes_files['test']}",
        "--distribution=horovod",
        "--model=resnet8",  # With BatchNorm: its statistics must agree.
        "--batch_size=32",
        "--train_steps=30",
        "--learning_rate=0.4",
        "--lr_decay_fractions=1",
        "--log_every_steps=10",
        "--eval_every_steps=15",
        "--checkpoint_every_steps=15",
        "--ema_decay=0.9",
    ]
    (run,) = engine_runs.run_workers((flags, 2))
    rank0, rank1 = run.weights(0), run.weights(1)
    assert len(rank0) == len(rank1) > 30
    for ours, theirs in zip(rank0, rank1, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    # The weights' moving averages agree too, and are not the weights.
    ema0, ema1 = run.weights(0, name="ema"), run.weights(1, name="ema")
    assert len(ema0) == len(rank0)
    for ours, theirs in zip(ema0, ema1, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert any(not np.allclose(a, w) for a, w in zip(ema0, rank0, strict=True))

    # One progress line per step, the chief's: rank 1's would repeat it.
    losses = logged_losses(run.output)
    assert len(losses) >= 3 and not logged_losses(run.output, rank=1)
    assert losses[-1] < 0.8 * losses[0], losses
    # Each rank evaluates its half of the test file; the counts add up,
    # and the chief alone says so (rank 1 logs no line of its own).
    assert run.output.count("over 40 examples") == 2
    assert not re.search(
        r"^\[1\]<stderr>:.*(training \w+ on|eval at step|done:)",
        run.output,
        re.M,
    ), run.output
    dump = pathlib.Path(run.dump_dir)
    saves = (dump / "saves_rank0.txt").read_text().split()
    assert [path.rsplit("-", 1)[1] for path in saves] == ["15", "30"]
    assert not (dump / "saves_rank1.txt").exists()
    pid0 = (dump / "pid_rank0.txt").read_text()
    pid1 = (dump / "pid_rank1.txt").read_text()
    events = [
        name
        for _, _, files in os.walk(os.path.join(run.dump_dir, "log"))
        for name in files
        if name.startswith("events.out")
    ]
    assert events and all(f".{pid0}." in name for name in events), events
    assert not any(f".{pid1}." in name for name in events)


def test_horovod_equals_one_process_and_mirrored():
    """Same seed, global batch 16, 6 steps of momentum SGD with weight decay.

    The model has no BatchNorm, whose batch statistics would legitimately
    differ between one batch of 16 and two of 8.
    """
    single, mirrored, hvd = engine_runs.equivalence_runs(
        Spec("default"),
        Spec("mirrored", extra=("--cpu_replicas=2",)),
        Spec("horovod", ranks=2),
    )
    assert "over 2 replica(s) (mirrored)" in mirrored.output
    assert "over 2 replica(s) (horovod)" in hvd.output
    first = single.weights(name="first")
    for run in (mirrored, hvd):
        engine_runs.assert_same_weights(run.weights(), single.weights(), first)
    for ours, theirs in zip(hvd.weights(0), hvd.weights(1), strict=True):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(
    "knob",
    [(), ("--gradient_compression=fp16",), ("--accumulate_steps=2",)],
    ids=["plain", "fp16", "accumulate"],
)
def test_overlapped_buckets_sum_as_one_group(knob):
    """Four buckets (of 16 bytes: a tensor each) against one group.

    Each sum is the same two gradients added, whichever all-reduce carries
    it: the weights are equal to the bit.
    """
    overlapped, one_group = engine_runs.equivalence_runs(
        Spec("horovod", 2, extra=("--all_reduce_pack_bytes=16", *knob)),
        Spec("horovod", 2, extra=("--nooverlap_all_reduce", *knob)),
    )
    assert "gradient all-reduce: 4 bucket(s)" in overlapped.output
    assert "gradient all-reduce: one group after" in one_group.output
    engine_runs.assert_same_weights(
        overlapped.weights(),
        one_group.weights(),
        one_group.weights(name="first"),
        rtol=0,
    )


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def _wait_for_pids(started, timeout=180):
    """Pids of both ranks, once both have finished a training step."""
    paths = [
        pathlib.Path(started.dump_dir, f"pid_rank{rank}.txt") for rank in (0, 1)
    ]
    deadline = time.time() + timeout
    while not all(path.exists() for path in paths):
        if started.process.poll() is not None or time.time() > deadline:
            output = pathlib.Path(started.output_path).read_text()
            pytest.fail(f"ranks did not start training:\n{output[-3000:]}")
        time.sleep(0.5)
    return [int(path.read_text()) for path in paths]


@pytest.mark.parametrize(
    "sig, gloo_timeout, bound",
    [
        # Died: the survivor's next collective fails on the closed socket.
        (signal.SIGKILL, 30, 30),
        # Hung (a frozen host): gloo gives up after its timeout, then
        # horovodrun kills the stopped rank (5 s grace after SIGTERM). The
        # timeout also bounds how far apart the ranks may reach hvd.init(),
        # so it cannot be tiny on a loaded machine.
        (signal.SIGSTOP, 15, 45),
    ],
    ids=["killed", "hung"],
)
def test_losing_a_rank_ends_the_job(sig, gloo_timeout, bound):
    flags = [
        *engine_runs.equivalence_flags(0.1),
        "--distribution=horovod",
        "--train_steps=1000000",
        "--log_every_steps=100000",
    ]
    started = engine_runs.start_worker(
        flags, ranks=2, HOROVOD_GLOO_TIMEOUT_SECONDS=str(gloo_timeout)
    )
    pids = []
    try:
        pids = _wait_for_pids(started)
        os.kill(pids[1], sig)
        begin = time.time()
        run = started.result(timeout=bound + 60)
        elapsed = time.time() - begin
        survivor_alive = _alive(pids[0])
    finally:
        started.stop()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    output = run.output
    assert elapsed < bound, f"took {elapsed:.1f}s\n{output[-2000:]}"
    assert not survivor_alive, "the surviving rank is still running"
    # The launcher's last line, after horovodrun's traceback: a lost peer
    # (rank 0's own line, or the launcher's for a rank killed before
    # rank 0 said one), with the exit code a Slurm job requeues on.
    assert run.returncode == 4, output[-2000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith(
        "resnet_main: error: lost a task of the training cluster"
    ), output[-2000:]
    if sig == signal.SIGSTOP:
        assert "Timed out waiting 15000ms" in output, output[-2000:]
        # Gloo's timeout shut Horovod down: rank 0 ends as having lost a
        # peer (exit 4), naming it, and horovodrun names that exit code;
        # whether its all-reduce was in flight then or came after is a race.
        assert re.search(
            r"^\[0\]<stderr>:resnet_main: error: lost a task of the "
            r"training cluster after step \d+ \((Horovod has been shut down"
            r"|an all-reduce in flight failed).*; waiting on rank 1 on ",
            output,
            re.M,
        ), output[-2000:]
        assert "Exit code: 4" in output, output[-2000:]


HOROVOD_KNOBS = """
import os, sys
import tensorflow as tf
from tf_resnet.runtime import distributor_for
from tf_resnet.config.settings import DistributionConfig
dist = DistributionConfig(
    gradient_compression=sys.argv[1], all_reduce_pack_bytes=int(sys.argv[2])
)
mode = distributor_for("horovod", 8, dist)  # A rank of its own (size 1).
# float16 rounds 1 + 2**-12 to 1 and 2**-30 to 0.
(grad,) = mode.all_reduce_gradients([tf.constant([1 + 2**-12, 2**-30])])
print(grad.dtype.name, *grad.numpy().tolist(),
      os.environ.get("HOROVOD_FUSION_THRESHOLD"))
mode.shutdown()
"""


def test_gradient_compression_and_fusion_threshold_reach_horovod():
    def run(*args, threshold=None):
        output = run_python(
            HOROVOD_KNOBS, *args, env={"HOROVOD_FUSION_THRESHOLD": threshold}
        )
        dtype, *sums, threshold = output.split()
        return dtype, [float(x) for x in sums], threshold

    assert run("fp16", "65536") == ("float32", [1.0, 0.0], "65536")
    # Uncompressed; an explicit horovodrun --fusion-threshold-mb wins.
    assert run("none", "65536", threshold="1024") == (
        "float32",
        [1 + 2**-12, 2**-30],
        "1024",
    )


def test_one_device_per_rank():
    with pytest.raises(UserInputError, match="one device per process"):
        distributor_for("horovod", 128, DistributionConfig(cpu_replicas=2))


def test_sync_bn_is_refused_under_horovod():
    proc = run_main(
        [
            "--distribution=horovod",
            "--sync_bn",
            "--train_data_path=unused.bin",
            "--eval_data_path=unused.bin",
        ]
    )
    assert proc.returncode == 2
    assert "--sync_bn is not supported with --distribution=horovod" in (
        proc.stderr
    )


def test_eval_job_on_two_ranks_equals_one_process_and_only_rank_0_writes():
    """The eval job's counts, confusion matrix included, sum over ranks."""
    (trained,) = engine_runs.equivalence_runs(Spec("default"))
    log_root = os.path.join(trained.dump_dir, "log")
    one = pathlib.Path(engine_runs.new_dir("eval_one"))
    two = pathlib.Path(engine_runs.new_dir("eval_two"))

    def eval_job(eval_dir, distribution):
        return [
            "--mode=eval",
            "--eval_once",
            f"--log_root={log_root}",  # Wins over the worker's own.
            f"--eval_dir={eval_dir}",
            f"--eval_data_path={engine_runs.equivalence_data()['test']}",
            f"--distribution={distribution}",
            "--dtype=float32",
        ]

    one_run, two_run = engine_runs.run_workers(
        (eval_job(one, "default"), None), (eval_job(two, "horovod"), 2)
    )
    # 32 test records, 16 per rank: the chief logs the summed count.
    assert two_run.output.count("over 32 examples") == 1, two_run.output
    matrix = (one / "confusion_matrix.csv").read_text()
    assert matrix == (two / "confusion_matrix.csv").read_text()
    counts = [
        [int(v) for v in line.split(",")[1:]]
        for line in matrix.splitlines()[1:]
    ]
    assert np.shape(counts) == (10, 10) and np.sum(counts) == 32
    per_class = (one / "per_class.csv").read_text()
    assert per_class == (two / "per_class.csv").read_text()
    header, *rows = (one / "eval.csv").read_text().splitlines()
    header2, *rows2 = (two / "eval.csv").read_text().splitlines()
    columns = (
        "step,epoch,precision,best_precision,loss,precision_at_5,"
        "train_accuracy,train_loss,split,examples"
    )
    assert header == header2 == columns
    assert len(rows) == len(rows2) == 1 and rows[0].startswith("6,")
    first, second = rows[0].split(","), rows2[0].split(",")
    numbers = len(columns.split(",")) - 4  # Before the training columns.
    np.testing.assert_allclose(
        np.float64(first[:numbers]), np.float64(second[:numbers]), 1e-5
    )
    # The eval job's training columns (none: it does not train), its split
    # and the images it evaluated (all 32 on either).
    assert first[numbers:] == second[numbers:]
    # Only the chief writes: files (observed by the worker) and events.
    dump = pathlib.Path(two_run.dump_dir)
    written = (dump / "writes_rank0.txt").read_text().split()
    assert sorted(os.path.basename(path) for path in written) == [
        "confusion_matrix.csv",
        "confusion_matrix.png",
        "eval.csv",
        "learning_curve.png",
        "per_class.csv",
    ]
    assert not (dump / "writes_rank1.txt").exists()
    events = [p for p in os.listdir(two) if p.startswith("events.out")]
    assert len(events) == 1, events
    assert (pathlib.Path(one_run.dump_dir) / "writes_rank0.txt").exists()

"""Runs of `tests/hvd_worker.py` under the engines' launchers, compared.

Multi-process runs go through `tf_resnet.launch.horovod` (Horovod ranks) or
`tf_resnet.launch.tf_config_cluster` (the workers of a TF_CONFIG cluster), each
in a loopback-only network namespace; `Spec`, `equivalence_runs` and
`assert_same_weights` are the equivalence setup the engine tests share
(Horovod, averaging, multi_worker, Ray, preemption, reliability, the Slurm
cluster and the cluster user). Independent runs start side by side; the
equivalence runs are cached for the session, so a run several files
compare against (the single process, synchronous Horovod) is trained once
per pytest worker.

The equivalence data make every mode compute the same gradients: 64
records (4 global batches of 16) read without shuffling, so one global step
covers the same 16 records whether one process reads them in order, two
Mirrored replicas split each batch, or two Horovod ranks read every second
record; and images whose content stays clear of the 4-pixel crop margin,
which the pixel-permutation-invariant `pointwise_cnn` sees the same after
any crop and flip.
"""

import atexit
import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import typing

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "hvd_worker.py")
GLOBAL_BATCH = 16
TRAIN_RECORDS = 64
STEPS = 6

_ROOT = tempfile.mkdtemp(prefix="tf_resnet_horovod_")
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


def worker_command(args, ranks=None, launcher="horovod"):
    """The worker's command line; as `ranks` processes if given.

    Ranks are started by `tf_resnet.launch.horovod` (`horovodrun` in a
    loopback-only network namespace), or with `launcher="tf_config_cluster"` as
    the workers of a TF_CONFIG cluster by `tf_resnet.launch.tf_config_cluster`
    (in such a namespace too), so every multi-process test runs there.
    """
    if ranks is None:
        return [sys.executable, WORKER, *args]
    return [
        sys.executable, "-m", f"tf_resnet.launch.{launcher}", f"--np={ranks}",
        f"--main={WORKER}",
        "--", *args,
    ]  # fmt: skip


def worker_env(**extra):
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


def new_dir(name):
    return tempfile.mkdtemp(prefix=f"{name}_", dir=_ROOT)


def dumped_weights(dump_dir, rank=0, name="weights"):
    """The arrays rank `rank` of a worker run dumped as `<name>_rank<r>.npz`."""
    path = os.path.join(dump_dir, f"{name}_rank{rank}.npz")
    with np.load(path) as arrays:
        return [arrays[f"arr_{i}"] for i in range(len(arrays.files))]


@dataclasses.dataclass
class Run:
    """A finished worker run and what its ranks dumped."""

    returncode: int
    output: str
    dump_dir: str

    def weights(self, rank=0, name="weights"):
        return dumped_weights(self.dump_dir, rank, name)

    def check(self):
        assert self.returncode == 0, self.output[-3000:]
        return self


@dataclasses.dataclass
class Started:
    """A worker run in progress (its own process group)."""

    process: subprocess.Popen
    dump_dir: str

    @property
    def output_path(self):
        return os.path.join(self.dump_dir, "output.txt")

    def result(self, timeout=300):
        try:
            returncode = self.process.wait(timeout=timeout)
        finally:
            self.stop()
        with open(self.output_path) as stream:
            return Run(returncode, stream.read(), self.dump_dir)

    def stop(self):
        """Kills the run's process group if it is still running."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def start_worker(args, ranks=None, launcher="horovod", **env):
    """Starts training with `args` (resnet_main flags) in the background."""
    dump_dir = new_dir("run")
    command = worker_command(
        [f"--dump_dir={dump_dir}", f"--log_root={dump_dir}/log", *args],
        ranks,
        launcher,
    )
    with open(os.path.join(dump_dir, "output.txt"), "w") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=worker_env(**env),
            cwd=ROOT,  # Where `python -m tf_resnet.launch.horovod` finds it.
            start_new_session=True,
        )
    return Started(process, dump_dir)


def run_workers(*runs):
    """Runs `(args, ranks[, launcher])` side by side; checked `Run`s."""
    started = [start_worker(*run) for run in runs]
    return [run.result().check() for run in started]


def write_records(path, images, labels):
    planes = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
    with open(path, "wb") as stream:
        stream.write(np.concatenate([labels[:, None], planes], 1).tobytes())


@functools.cache
def equivalence_data():
    """Train/test CIFAR-10 files (and the two rank shards of the train file).

    Pixel content only inside the central 24x24, so a crop of the 4-pixel
    zero-padded image moves it but never cuts it.
    """
    rng = np.random.default_rng(5)
    count = TRAIN_RECORDS + 32
    images = np.zeros((count, 32, 32, 3), np.uint8)
    images[:, 4:28, 4:28] = rng.integers(1, 256, (count, 24, 24, 3))
    labels = rng.integers(0, 10, count).astype(np.uint8)
    folder = new_dir("data")
    paths = {
        name: os.path.join(folder, f"{name}.bin")
        for name in ("train", "test", "shard0", "shard1")
    }
    train_images, train_labels = images[:TRAIN_RECORDS], labels[:TRAIN_RECORDS]
    write_records(paths["train"], train_images, train_labels)
    write_records(paths["test"], images[TRAIN_RECORDS:], labels[TRAIN_RECORDS:])
    for shard in (0, 1):  # What Horovod rank `shard` of 2 reads.
        write_records(
            paths[f"shard{shard}"],
            train_images[shard::2],
            train_labels[shard::2],
        )
    return paths


def equivalence_flags(
    learning_rate, batch_size=GLOBAL_BATCH, train="train", shuffle=True
):
    """Flags of one equivalence run.

    Shuffled, N ranks or workers read strides of one permutation per epoch,
    so a step's examples are one process's global batch; `shuffle=False`
    reads the files in order, so rank `r` of 2 reads file `shard<r>`.
    """
    paths = equivalence_data()
    return [
        f"--train_data_path={paths[train]}",
        f"--eval_data_path={paths['test']}",
        "--model=pointwise_cnn",
        f"--batch_size={batch_size}",
        f"--train_steps={STEPS}",
        f"--learning_rate={learning_rate}",
        "--momentum=0.9",
        "--weight_decay=0.001",
        *([] if shuffle else ["--noshuffle"]),
        "--eval_every_steps=1000",
        "--checkpoint_every_steps=1000",
        "--seed=3",
        # Equal to 1e-4 needs float32 (--dtype=auto is bf16 on AMX CPUs).
        "--dtype=float32",
    ]


class Spec(typing.NamedTuple):
    """One run of the equivalence setup."""

    distribution: str
    ranks: int | None = None
    learning_rate: float = 0.4
    extra: tuple = ()
    launcher: str = "horovod"

    def args(self):
        return [
            *equivalence_flags(self.learning_rate),
            f"--distribution={self.distribution}",
            *self.extra,
        ]


_EQUIVALENCE_RUNS = {}


def equivalence_runs(*specs):
    """Checked runs of the equivalence setup, cached, new ones side by side."""
    new = [
        spec for spec in dict.fromkeys(specs) if spec not in _EQUIVALENCE_RUNS
    ]
    done = run_workers(
        *[(spec.args(), spec.ranks, spec.launcher) for spec in new]
    )
    _EQUIVALENCE_RUNS.update(zip(new, done, strict=True))
    return [_EQUIVALENCE_RUNS[spec] for spec in specs]


def assert_same_weights(actual, expected, moved, rtol=1e-4):
    """`actual` equals `expected` to `rtol` of how far training moved them.

    Args:
      actual, expected: lists of arrays.
      moved: list of arrays the run started from (after its first step), to
        show the tolerance is far below the change training made.
    """
    travelled = max(
        float(np.abs(e - m).max()) for e, m in zip(expected, moved, strict=True)
    )
    difference = max(
        float(np.abs(a - e).max())
        for a, e in zip(actual, expected, strict=True)
    )
    assert travelled > 1e-3, f"training barely moved the weights: {travelled}"
    assert difference <= rtol * travelled, (
        f"weights differ by {difference:.3g}; training moved them "
        f"{travelled:.3g}"
    )
    return difference, travelled

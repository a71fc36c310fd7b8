"""Shared machinery of the benchmarks: contenders timed side by side.

On a shared machine absolute speeds drift by 2x within minutes, so the
result of every benchmark is a RATIO measured in one run: each contender
lives in its own worker process (its own threads, environment and
framework), all are warmed up first, and then one timed block of each runs
in turn, `repetitions` rounds, with the order rotated every round. A burst
of load from elsewhere then hits every contender alike. Idle workers block
on a pipe and use no CPU.

Each row reports the median over the rounds with the min-max range; the
warm-up (tracing, compilation, tf.data autotuning) is timed once and reported
separately.
"""

import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import tf_resnet  # noqa: E402,F401  # Before TensorFlow: sets its environment.

# $BENCH_DATA_DIR, else `datasets/` of the checkout: where data/download.py
# writes, so a benchmark reads what a user downloaded.
SAMPLES_DIR = os.environ.get("BENCH_DATA_DIR", os.path.join(ROOT, "datasets"))
CIFAR_DIR = os.path.join(SAMPLES_DIR, "cifar-10-batches-bin")
# $BENCH_TINYIMAGENET_DIR: another folder of that layout, e.g. the 200-class
# one that data/make_synthetic_tinyimagenet.py writes.
TINYIMAGENET_DIR = os.environ.get(
    "BENCH_TINYIMAGENET_DIR",
    os.path.join(SAMPLES_DIR, "tiny-imagenet-200-10class"),
)

# The real data samples the benchmarks read (never copied into the repo);
# their facts come from `tf_resnet.data`: the table and the opened split.
DATA = {
    "cifar10": {
        "dataset": "cifar10",
        "path": os.path.join(CIFAR_DIR, "data_batch*"),
        "eval_path": os.path.join(CIFAR_DIR, "test_batch.bin"),
    },
    "tinyimagenet": {
        "dataset": "tinyimagenet",
        "path": TINYIMAGENET_DIR,
        "eval_path": TINYIMAGENET_DIR,
    },
}


@functools.cache
def training_split(data_name):
    """The training split of a sample, opened once per process."""
    from tf_resnet import data

    info = DATA[data_name]
    return data.open_split(info["dataset"], info["path"], training=True)


def image_size(data_name):
    """Side of the sample's images, from the table of dataset facts."""
    from tf_resnet import data

    return data.DATASETS[DATA[data_name]["dataset"]].image_size


def num_classes(data_name):
    """Classes of the sample: the TinyImageNet one has 10 of the 200."""
    return training_split(data_name).num_classes


def build_training_dataset(
    data_name, batch_size, num_shards=1, index=0, normalization="per_image"
):
    """The training input pipeline exactly as `train_loop.train` builds it."""
    from tf_resnet import data

    return training_split(data_name).dataset(
        batch_size,
        data.InputOptions(
            seed=0,
            num_shards=num_shards,
            shard_index=index,
            normalization=normalization,
        ),
    )


def peak_rss_mb():
    """Peak resident memory of this process and its live children, MB.

    The sum of each one's high-water mark (`VmHWM`), so input pipelines
    that decode in worker processes (PyTorch's DataLoader) are counted
    whole; shared pages count once per process.
    """
    pids = [os.getpid()]
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as stream:
                pids.extend(int(pid) for pid in stream.read().split())
    except OSError:
        pass
    total_kb = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as stream:
                for line in stream:
                    if line.startswith("VmHWM:"):
                        total_kb += int(line.split()[1])
        except OSError:
            pass  # A child that has just exited.
    return total_kb / 1024


def load_average():
    """The 1-minute load average (other users' work competes for cores)."""
    return os.getloadavg()[0]


def print_environment(title):
    """A header naming what the numbers depend on."""
    import tensorflow as tf  # Imported late: workers set threads first.

    from tf_resnet import runtime

    print(f"== {title}")
    print(
        f"   {cpu_model()}, {os.cpu_count()} cores, load average "
        f"{load_average():.2f} at start; TensorFlow {tf.__version__}, "
        f"Python {platform.python_version()}; --dtype=auto is "
        f"{runtime.resolve_dtype('auto')} here"
    )
    sys.stdout.flush()


def cpu_model():
    """The CPU's name, family/model and native bfloat16 flags.

    Two machines that both call themselves "AMD EPYC" can be a Zen 3
    without bfloat16 and a Zen 4 with it, and `--dtype=auto` differs
    between them; the family, model and flags tell them apart.
    """
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            for line in stream:
                key, _, value = line.partition(":")
                key = key.strip()
                if not line.strip():
                    break  # The first processor's block is enough.
                fields.setdefault(key, value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" not in fields:
        return name
    # The flags `--dtype=auto` decides by, read the way it reads them.
    from tf_resnet import runtime  # Imports TensorFlow: only when needed.

    bf16 = runtime.cpu_bf16_flags()
    return (
        f"{name} (family {fields['cpu family']}, model "
        f"{fields.get('model', '?')}; {', '.join(bf16) or 'no bf16'})"
    )


def start_runtime(**values):
    """`runtime.start` of a config with these fields, as resnet_main does.

    Must run before TensorFlow executes anything (thread pools, devices).
    """
    from tf_resnet import runtime
    from tf_resnet.config.settings import make_config

    return runtime.start(make_config(**values))


def start_mode(config):
    """Start-up and the config's distribution mode, as resnet_main does.

    Keras' seed is set in between, so every process builds the same
    weights.
    """
    import keras

    from tf_resnet import runtime
    from tf_resnet.engines.distributors import make_distributor

    started = runtime.start(config)
    keras.utils.set_random_seed(0)
    return make_distributor(
        started.engine,
        config.optim,
        config.distribution,
        started.devices,
    )


def fixed_batch_step(config, mode, image_size, classes, total_steps):
    """A run's model, optimizer and training step, fed one random batch.

    Built as a run builds them (`builders`, `train_loop.make_replica_fn`,
    `Distributor.make_train_step`), the chief's weights broadcast to the
    other processes; the batch is one fixed random batch, repeated, so the
    step is timed or profiled without its input pipeline. `total_steps`:
    the learning-rate schedule's length.

    Returns:
      A namespace: `model`, `optimizer`, `state` (their `TrainState`),
      `step` (the training step, called with `iterator`) and `iterator`.
    """
    import numpy as np
    import tensorflow as tf

    from tf_resnet import builders, train_loop
    from tf_resnet.distribute.base import TrainState

    info = types.SimpleNamespace(num_classes=classes, image_size=image_size)
    model = builders.build_model(config, mode, info)
    optimizer = builders.build_optimizer(
        config, mode, model, total_steps=total_steps
    )
    state = TrainState(model, optimizer)
    mode.broadcast_initial_state(state)
    step = mode.make_train_step(
        train_loop.make_replica_fn(model, optimizer, mode, config)
    )
    rng = np.random.default_rng(0)
    shape = (mode.batch.replica_batch, image_size, image_size, 3)
    batch = (
        rng.normal(size=shape).astype("float32"),
        rng.integers(0, classes, size=mode.batch.replica_batch).astype("int32"),
    )
    iterator = mode.distribute_dataset(
        lambda *_: tf.data.Dataset.from_tensors(batch).repeat()
    )
    return types.SimpleNamespace(
        model=model,
        optimizer=optimizer,
        state=state,
        step=step,
        iterator=iterator,
    )


class Stats:
    """Median, min and max of repeated measurements."""

    def __init__(self, values):
        self.values = list(values)
        self.median = statistics.median(self.values)
        self.min = min(self.values)
        self.max = max(self.values)

    def format(self, digits=0):
        return (
            f"{self.median:.{digits}f} "
            f"({self.min:.{digits}f}-{self.max:.{digits}f})"
        )


def ratio(numerators, denominators):
    """Per-round ratios of two contenders timed in the same rounds."""
    return Stats(a / b for a, b in zip(numerators, denominators, strict=True))


def worker_row(worker, rates, relative):
    """The usual table row of a contender timed by `run_side_by_side`.

    Cells: its name, images/sec median (min-max), `relative` (a `Stats` of
    per-round ratios against the script's reference) and its warm-up seconds.
    """
    return [
        worker.name,
        Stats(rates[worker.name]).format(),
        relative.format(2),
        f"{worker.info['warmup_s']:.1f}",
    ]


def print_table(title, header, rows):
    """A Markdown table (pasteable into a page of bench/results/)."""
    print(f"\n{title}\n")
    widths = [
        max(len(str(cell)) for cell in column)
        for column in zip(header, *rows, strict=True)
    ]

    def line(cells):
        padded = (str(c).ljust(w) for c, w in zip(cells, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    print(line(header))
    print("| " + " | ".join("-" * w for w in widths) + " |")
    for row in rows:
        print(line(row))
    sys.stdout.flush()


class Worker:
    """One contender in its own process, driven over a pipe.

    The worker script calls `serve(setup)` when started with
    `--worker <json spec>`; `setup` builds the contender and returns a
    function that runs one timed block and returns the images it processed
    (or `(images, seconds)` when it times itself).
    """

    def __init__(self, name, script, spec, env=None, python=None):
        self.name = name
        self.spec = spec
        self.process = subprocess.Popen(
            [python or sys.executable, script, "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
            cwd=ROOT,
        )
        self.info = self._receive()

    def _receive(self):
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(
                f"worker {self.name!r} exited with code {code} (see stderr)"
            )
        return json.loads(line)

    def run_block(self):
        """Runs one timed block; returns `(seconds, images)`."""
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        result = self._receive()
        return result["seconds"], result["images"]

    def stats(self):
        """The worker's figures now: `{"peak_rss_mb": ...}`."""
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return self._receive()

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)


def serve(setup):
    """Worker side of `Worker`: set up, report the warm-up, time blocks.

    `setup()` returns `(run_block, info)`; "stats" commands are answered
    with `{"peak_rss_mb": ...}`. The protocol uses a private copy of
    stdout; fd 1 is pointed at stderr so that library output cannot
    corrupt it.
    """
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    start = time.perf_counter()
    run_block, info = setup()
    info["warmup_s"] = time.perf_counter() - start
    _send(channel, info)
    for command in sys.stdin:
        if command.strip() == "stats":
            _send(channel, {"peak_rss_mb": peak_rss_mb()})
            continue
        if command.strip() != "run":
            break
        start = time.perf_counter()
        result = run_block()
        seconds = time.perf_counter() - start
        # A block may time itself (e.g. excluding model.fit's set-up).
        images, seconds = (
            result if isinstance(result, tuple) else (result, seconds)
        )
        _send(channel, {"seconds": seconds, "images": images})


def _send(channel, message):
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def run_side_by_side(workers, repetitions):
    """Times `repetitions` rounds of one block per worker.

    Returns:
      `{worker name: [images/sec of each round]}`.
    """
    rates = {worker.name: [] for worker in workers}
    for round_index in range(repetitions):
        shift = round_index % len(workers)
        for worker in workers[shift:] + workers[:shift]:
            seconds, images = worker.run_block()
            rates[worker.name].append(images / seconds)
    return rates


def close_all(workers):
    for worker in workers:
        worker.close()


def worker_spec(argv):
    """The JSON spec after `--worker`, or `None` in the orchestrator."""
    if "--worker" in argv:
        return json.loads(argv[argv.index("--worker") + 1])
    return None


def run_script(main, serve):
    """A benchmark script's entry point, as worker or as orchestrator.

    Every script is both: its workers are the script started again with
    `--worker <json spec>` (by `Worker`, or by horovodrun in scaling.py)
    and run `serve(spec)`; started by hand, it runs `main()`, which starts
    and times them.
    """
    spec = worker_spec(sys.argv)
    if spec is None:
        main()
    else:
        serve(spec)

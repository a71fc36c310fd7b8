"""Where a training step's time goes, by op kind: ours vs the PyTorch twin.

  .venv/bin/python bench/op_profile.py --model=resnet56 --dtype=mixed_bfloat16

The ratio benchmarks say how fast; this says why. Each framework runs in its
own process (same batch, threads and precision) under its own profiler
(TensorFlow's `tf.profiler`, PyTorch's `torch.profiler`), and the op times
of `--steps` steps are summed per kind: convolutions, batch norm, ReLU,
additions, the rest, and the gap between the wall time and the op times
(dispatch, scheduling). TensorFlow runs with ONE inter-op thread here so
that its ops do not overlap and their times add up like PyTorch's (its
default, one inter-op thread per core, is ~5% faster: train_step.py).
Profiler times are inflated by the profiler itself; compare the columns,
not the totals with train_step.py.
"""

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

KINDS = (
    ("convolution", ("conv",)),
    ("batch norm", ("batchnorm", "batch_norm")),
    ("ReLU", ("relu", "threshold", "clamp_min")),
    ("add", ("addv2", "addn", "aten::add")),
)


def kind_of(op_name):
    """The row an op type (TF) or aten op (PyTorch) is counted in."""
    lowered = op_name.lower()
    for kind, needles in KINDS:
        if any(needle in lowered for needle in needles):
            return kind
    return "other ops"


def fixed_batch(batch):
    import numpy as np

    rng = np.random.default_rng(0)
    images = rng.normal(size=(batch, 32, 32, 3)).astype("float32")
    return images, rng.integers(0, 10, size=batch).astype("int32")


def profile_tf(args):
    """Milliseconds by TF op type of the training loop's step."""
    import keras
    import tensorflow as tf

    common.set_tf_threads(args.threads, 1)
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from tf_resnet import flags, train_loop
    from tf_resnet.distribute import tf_strategy

    keras.config.set_dtype_policy(flags.resolve_dtype(args.dtype))
    config = train_loop.TrainConfig(
        train_data_path=common.DATA["cifar10"]["path"],
        model=args.model,
        batch_size=args.batch,
    )
    mode = tf_strategy.default_mode()
    mode.set_global_batch(args.batch)
    model, optimizer = train_loop.build_model_and_optimizer(
        config, mode, total_steps=100_000
    )
    step = mode.make_train_step(
        train_loop.make_replica_fn(model, optimizer, mode, config)
    )
    batch = fixed_batch(args.batch)
    iterator = mode.distribute_dataset(
        lambda *_: tf.data.Dataset.from_tensors(batch).repeat()
    )

    def run(steps):
        for _ in range(steps):
            metrics = step(iterator)
        mode.fetch(metrics)

    run(10)  # Tracing, oneDNN primitive caches.
    logdir = tempfile.mkdtemp()
    start = time.perf_counter()
    tf.profiler.experimental.start(logdir)
    run(args.steps)
    tf.profiler.experimental.stop()
    wall = time.perf_counter() - start
    space = xplane_pb2.XSpace()
    (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    with open(path, "rb") as stream:
        space.ParseFromString(stream.read())
    per_op = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and "::" not in name:  # "scope/op:OpType"
                    per_op[name.rsplit(":", 1)[1]] += event.duration_ps / 1e9
    return per_op, wall * 1e3


def profile_torch(args):
    """Milliseconds by aten op of the PyTorch twin's step."""
    import torch
    import torch_resnet
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch_resnet.build(args.model, 10)
    model = model.to(memory_format=torch.channels_last)
    images, labels = fixed_batch(args.batch)
    images = torch.from_numpy(images).permute(0, 3, 1, 2)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.from_numpy(labels).long()
    model.train()
    step = torch_resnet.make_train_step(
        model, bfloat16=args.dtype == "mixed_bfloat16"
    )

    def run(steps):
        for _ in range(steps):
            loss = step(images, labels)
        loss.item()

    run(10)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        run(args.steps)
    wall = time.perf_counter() - start
    per_op = collections.Counter()
    for event in profiler.key_averages():
        per_op[event.key] += event.self_cpu_time_total / 1e3
    return per_op, wall * 1e3


def worker(args):
    """Profiles one framework; prints its per-kind ms per step as JSON."""
    profile = profile_tf if args.framework == "tf" else profile_torch
    per_op, wall = profile(args)
    per_kind = collections.Counter()
    for op, ms in per_op.items():
        per_kind[kind_of(op)] += ms / args.steps
    per_kind["gap (wall - ops)"] = wall / args.steps - sum(per_kind.values())
    per_kind["wall"] = wall / args.steps
    print(json.dumps(per_kind))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet56")
    parser.add_argument(
        "--dtype", default="mixed_bfloat16", help="mixed_bfloat16 or float32"
    )
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--framework", choices=("tf", "torch"))
    args = parser.parse_args()
    if args.framework:
        worker(args)
        return
    results = {}
    for framework in ("tf", "torch"):
        output = subprocess.run(
            [
                sys.executable,
                __file__,
                *sys.argv[1:],
                f"--framework={framework}",
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        ).stdout
        results[framework] = json.loads(output.strip().splitlines()[-1])
    rows = []
    for kind in [k for k, _ in KINDS] + [
        "other ops",
        "gap (wall - ops)",
        "wall",
    ]:
        ours, theirs = (
            results["tf"].get(kind, 0.0),
            results["torch"].get(kind, 0.0),
        )
        rows.append(
            [kind, f"{ours:.1f}", f"{theirs:.1f}", f"{ours - theirs:+.1f}"]
        )
    common.print_table(
        f"{args.model}, {args.dtype}, batch {args.batch}, {args.threads} "
        f"threads, {args.steps} profiled steps; load "
        f"{common.load_average():.2f} at end",
        ["ms per step", "ours (TF, 1 inter-op)", "PyTorch", "ours - PyTorch"],
        rows,
    )


if __name__ == "__main__":
    main()

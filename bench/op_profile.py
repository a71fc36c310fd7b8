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
not the totals with train_step.py. The wall time is taken inside the
profiled region (stopping a profiler and collecting its events take longer
than the steps). Each framework is profiled in `--processes` processes,
alternating, and every row shows the median over them.
"""

import argparse
import collections
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import train_step  # noqa: E402

TOP_OPS = 12  # Op types listed one by one.

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


def step_spec(args, inter):
    """The `train_step.py` contender spec of the step to profile.

    The profiled steps are built by `train_step.setup_ours` / `setup_torch`,
    so they are exactly the steps that benchmark times: one fixed CIFAR-10
    batch, channels-last, warmed up.
    """
    return {
        "model": args.model,
        "batch": args.batch,
        "threads": args.threads,
        "inter": inter,
        "dtype": args.dtype,
        "xla": 0,
        "layout": "channels_last",
        "steps": args.steps,
        "data": "cifar10",
        "input": "fixed",
    }


def profile_tf(args):
    """Milliseconds by TF op type of the training loop's step."""
    # One inter-op thread, so that TF's ops do not overlap (see above).
    run_block, _ = train_step.setup_ours(step_spec(args, inter=1))
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    logdir = tempfile.mkdtemp()
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    run_block()
    wall = time.perf_counter() - start  # Without the profiler's own stop.
    tf.profiler.experimental.stop()
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
    # inter=0: PyTorch's default inter-op pool, as in train_step.py.
    run_block, _ = train_step.setup_torch(step_spec(args, inter=0))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        run_block()
        wall = time.perf_counter() - start  # Without collecting the events.
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
    per_op = {op: ms / args.steps for op, ms in per_op.items()}
    print(json.dumps({"kinds": per_kind, "ops": per_op}))


def _median(mappings):
    """Per key, the median over `mappings` (missing counts as 0), largest first.

    Each row's median is taken on its own, so the rows need not add up to
    the median wall time.
    """
    mappings = list(mappings)
    keys = set().union(*mappings)
    medians = {
        k: statistics.median(m.get(k, 0.0) for m in mappings) for k in keys
    }
    return dict(sorted(medians.items(), key=lambda item: -item[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet56")
    parser.add_argument(
        "--dtype", default="mixed_bfloat16", help="mixed_bfloat16 or float32"
    )
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--processes",
        type=int,
        default=3,
        help="profiled processes per framework; the tables show medians "
        "(one process can be 10-30%% off the next on a shared host)",
    )
    parser.add_argument("--framework", choices=("tf", "torch"))
    args = parser.parse_args()
    if args.framework:
        worker(args)
        return
    runs = {"tf": [], "torch": []}
    for _ in range(args.processes):  # Alternating, so drift hits both.
        for framework, framework_runs in runs.items():
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
            framework_runs.append(json.loads(output.strip().splitlines()[-1]))
    results = {
        name: _median(r["kinds"] for r in rs) for name, rs in runs.items()
    }
    ops = {name: _median(r["ops"] for r in rs) for name, rs in runs.items()}
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
        f"threads, {args.steps} profiled steps, median of {args.processes} "
        f"processes each; {common.cpu_model()}, load "
        f"{common.load_average():.2f} at end",
        ["ms per step", "ours (TF, 1 inter-op)", "PyTorch", "ours - PyTorch"],
        rows,
    )
    # Op by op: which kernels make a row (e.g. TF's batch norm forward is
    # partly _FusedBatchNormEx, BN and ReLU in one kernel).
    tf_ops, torch_ops = (
        list(ops[name].items())[:TOP_OPS] for name in ("tf", "torch")
    )
    rows = []
    for rank in range(TOP_OPS):
        row = []
        for listing in (tf_ops, torch_ops):
            name, ms = listing[rank] if rank < len(listing) else ("", None)
            row += [name, "" if ms is None else f"{ms:.1f}"]
        rows.append(row)
    common.print_table(
        f"the {TOP_OPS} slowest op types of each, ms per step",
        ["TF op", "ms", "PyTorch op", "ms"],
        rows,
    )


if __name__ == "__main__":
    main()

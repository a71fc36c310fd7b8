"""How close the training step comes to the machine's dense matmul speed.

  .venv/bin/python bench/roofline.py

Achieved FLOP/s of a step = 3 x forward FLOPs per image x images/sec (the
backward pass costs about twice the forward: one convolution for the input
gradient, one for the weight gradient). Forward FLOPs are counted by
TensorFlow's profiler on the model's graph (convolutions and dense layers,
2 FLOPs per multiply-add). The ceiling is a large dense matmul in TensorFlow
with the same threads, in float32 and in bfloat16; the step is compared with
the ceiling of its own compute dtype and with float32's (the target). All
rows are measured side by side in one run.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import train_step  # noqa: E402

MATMUL_SIZE = 4096


def forward_flops(model_name, data_name):
    """Forward FLOPs of one image, as TensorFlow's profiler counts them."""
    import tensorflow as tf
    from tensorflow.python.framework import convert_to_constants

    from tf_resnet import models

    size = common.image_size(data_name)
    shape = (size, size, 3)
    model = models.build_model(model_name, common.num_classes(data_name), shape)
    forward = tf.function(
        lambda images: model(images, training=False)
    ).get_concrete_function(tf.TensorSpec((1, *shape), tf.float32))
    graph = convert_to_constants.convert_variables_to_constants_v2(forward)
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profile = tf.compat.v1.profiler.profile(
        graph.graph, options=options, cmd="op"
    )
    return profile.total_float_ops


def setup_matmul(spec):
    """Blocks of dense `n x n` matmuls; reports FLOPs as its 'images'."""
    import tensorflow as tf

    common.start_runtime(intra_op_threads=int(spec["threads"]))
    n = MATMUL_SIZE
    dtype = tf.as_dtype(spec["matmul_dtype"])
    a = tf.random.normal([n, n], dtype=tf.float32)
    b = tf.random.normal([n, n], dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(b, dtype)
    repeats = int(spec["repeats"])

    @tf.function
    def product():
        # One matmul per call: identical products inside one function would
        # be merged by Grappler. The sum keeps the whole product needed.
        return tf.reduce_sum(tf.cast(tf.linalg.matmul(a, b), tf.float32))

    def run_block():
        for _ in range(repeats):
            product().numpy()
        return repeats * 2 * n**3

    run_block()
    run_block()
    return run_block, {}


def serve(spec):
    if spec["kind"] == "matmul":
        common.serve(lambda: setup_matmul(spec))
    else:
        train_step.serve(spec)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet20,resnet56")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    common.print_environment("roofline: step FLOP/s vs dense matmul FLOP/s")
    from tf_resnet import runtime

    auto_dtype = runtime.resolve_dtype("auto")
    model_names = args.models.split(",")
    flops = {name: forward_flops(name, "cifar10") for name in model_names}
    step_base = {
        "kind": "ours",
        "data": "cifar10",
        "input": "fixed",
        "batch": args.batch,
        "threads": args.threads,
        "inter": 0,
        "xla": 0,
        "ema": 0,
        "steps": args.steps,
    }
    specs = {
        "matmul float32": {
            "kind": "matmul",
            "matmul_dtype": "float32",
            "threads": args.threads,
            "repeats": 4,
        },
        "matmul bfloat16": {
            "kind": "matmul",
            "matmul_dtype": "bfloat16",
            "threads": args.threads,
            "repeats": 12,
        },
    }
    dtypes = sorted({auto_dtype, "float32"})
    for name in model_names:
        for dtype in dtypes:
            specs[f"{name} step {dtype}"] = {
                **step_base,
                "model": name,
                "dtype": dtype,
            }
    workers = []
    try:
        for label, spec in specs.items():
            workers.append(common.Worker(label, __file__, spec))
        rates = common.run_side_by_side(workers, args.repetitions)
    finally:
        common.close_all(workers)
    peak32 = rates["matmul float32"]
    rows = []
    for label in specs:
        if label.startswith("matmul"):
            stats = common.Stats(r / 1e9 for r in rates[label])
            rows.append([label, "", stats.format(1) + " G", "", ""])
            continue
        name, _, dtype = label.split(" ")
        achieved = [3 * flops[name] * rate for rate in rates[label]]
        own = "bfloat16" if "bfloat16" in dtype else "float32"
        rows.append(
            [
                label,
                f"{3 * flops[name] / 1e6:.0f} M",
                common.Stats(r / 1e9 for r in achieved).format(1) + " G",
                common.ratio(achieved, peak32).format(2),
                common.ratio(achieved, rates[f"matmul {own}"]).format(2),
            ]
        )
    common.print_table(
        f"batch {args.batch}, {args.threads} threads, matmul {MATMUL_SIZE}^2,"
        f" {args.repetitions} rounds; load {common.load_average():.2f} at end",
        [
            "row",
            "train FLOPs/image",
            "FLOP/s median (min-max)",
            "/ float32 matmul",
            "/ matmul of own dtype",
        ],
        rows,
    )


if __name__ == "__main__":
    common.run_script(main, serve)

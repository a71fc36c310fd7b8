"""Channels-last (NHWC) vs channels-first (NCHW) convolutions on this CPU.

  .venv/bin/python bench/layout.py

The models are channels-last. Whether channels-first would pay is decided
by the convolutions, so this times a training step (forward, backward, SGD)
of a plain convolution stack with ResNet-20's layer shapes (3x3 convs, 16,
32 and 64 channels at 32, 16 and 8 pixels, batch 128) in both layouts, side
by side, in float32 and bfloat16. No batch norm: only the layout differs.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

# (filters, stride) of ResNet-20's 19 convolutions.
CONVS = [(16, 1)] * 7 + [(32, 2)] + [(32, 1)] * 5 + [(64, 2)] + [(64, 1)] * 5


def build_stack(data_format):
    import keras

    shape = (3, 32, 32) if data_format == "channels_first" else (32, 32, 3)
    inputs = keras.Input(shape)
    x = inputs
    for filters, strides in CONVS:
        x = keras.layers.Conv2D(
            filters,
            3,
            strides,
            padding="same",
            use_bias=False,
            activation="relu",
            data_format=data_format,
        )(x)
    x = keras.layers.GlobalAveragePooling2D(data_format=data_format)(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def setup_stack(spec):
    import keras
    import numpy as np
    import tensorflow as tf

    common.start_runtime(
        intra_op_threads=int(spec["threads"]), dtype=spec["dtype"]
    )
    model = build_stack(spec["layout"])
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    images = rng.normal(size=(spec["batch"], *model.input_shape[1:]))
    images = tf.constant(images, tf.float32)
    labels = tf.constant(rng.integers(0, 10, spec["batch"]), tf.int32)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(
                    labels, logits, from_logits=True
                )
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(
            zip(grads, model.trainable_variables, strict=True)
        )
        return loss

    def run_block():
        for _ in range(spec["steps"]):
            loss = step()
        loss.numpy()
        return spec["steps"] * spec["batch"]

    run_block()
    run_block()
    return run_block, {}


def serve(spec):
    common.serve(lambda: setup_stack(spec))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    common.print_environment("convolution layout, images/sec")
    workers = []
    try:
        for dtype in ("float32", "mixed_bfloat16"):
            for layout in ("channels_last", "channels_first"):
                spec = {
                    "layout": layout,
                    "dtype": dtype,
                    "batch": args.batch,
                    "threads": args.threads,
                    "steps": args.steps,
                }
                workers.append(
                    common.Worker(f"{layout} {dtype}", __file__, spec)
                )
        rates = common.run_side_by_side(workers, args.repetitions)
    finally:
        common.close_all(workers)
    rows = []
    for worker in workers:
        _, dtype = worker.name.split(" ")
        reference = rates[f"channels_last {dtype}"]
        relative = common.ratio(rates[worker.name], reference)
        rows.append(common.worker_row(worker, rates, relative))
    common.print_table(
        f"19-conv stack of ResNet-20's shapes, batch {args.batch}, "
        f"{args.threads} threads, {args.repetitions} rounds; load "
        f"{common.load_average():.2f} at end",
        [
            "layout, dtype",
            "images/sec median (min-max)",
            "/ channels_last",
            "warm-up s",
        ],
        rows,
    )


if __name__ == "__main__":
    common.run_script(main, serve)

"""Training-step throughput: our loop vs model.fit vs PyTorch, side by side.

  .venv/bin/python bench/train_step.py                       # the targets
  .venv/bin/python bench/train_step.py --models=resnet20 \
      --contenders=ours,ours:xla=1,ours:dtype=float32      # one change each

Every contender trains the same architecture on the same fixed batch
(random images, so input costs nothing) with SGD + momentum, weight decay
and cross-entropy from logits:

* `ours`: `train_loop.make_replica_fn` + `mode.make_train_step`, exactly the
  step `resnet_main.py` runs, with the same model and optimizer builder;
* `fit`: the same Keras model through `model.compile` + `model.fit` (the
  Keras default `jit_compile="auto"`, i.e. no XLA on a CPU);
* `torch`: the PyTorch twin from `bench/torch_resnet.py` (eager, the usual
  way to train it), channels-last or NCHW memory layout.

A contender is `kind[:key=value]...`; keys: `dtype` (Keras dtype policy),
`xla` (0/1), `bn` (`keras`: Keras' unfused layer instead of the
models' fused one; ours/fit only), `threads`, `inter`
(TF inter-op threads), `onednn` (0/1: TF_ENABLE_ONEDNN_OPTS), `layout`
(torch: `channels_last` or `nchw`), `data` (`cifar10` or `tinyimagenet`:
image size and classes), `input` (`fixed` batch or `real`: ours fed by the
training input pipeline), `wd` (weight decay, default 1e-4), `ema` (the
decay of a moving average of the weights updated after every step, as
`--ema_decay`; default 0: none), `preload`
(a shared library for LD_PRELOAD, e.g. another malloc). Unset keys
take the command-line values. `subsample=slice`: option-A shortcuts
subsample by slicing (as before) instead of a 1x1 average pool.
Parameter counts and weight shapes of the PyTorch twin are asserted equal
to the Keras model's before anything is timed.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

NUM_CLASSES = 10
KEYS = (
    "dtype",
    "xla",
    "bn",
    "threads",
    "inter",
    "onednn",
    "layout",
    "data",
    "input",
    "wd",
    "ema",
    "subsample",
    "preload",
)


def parse_contender(text, defaults):
    """`kind[:key=value]...` -> spec dict (defaults filled in)."""
    kind, *options = text.split(":")
    spec = {**defaults, "kind": kind, "label": text}
    for item in options:
        key, equals, value = item.partition("=")
        if not equals or key not in KEYS:
            raise SystemExit(f"bad contender option {item!r} in {text!r}")
        spec[key] = value
    return spec


# ---------------------------------------------------------------- workers


def _fixed_batch(spec, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    size = common.image_size(spec["data"])
    images = rng.normal(size=(int(spec["batch"]), size, size, 3))
    labels = rng.integers(
        0, common.num_classes(spec["data"]), size=int(spec["batch"])
    )
    return images.astype("float32"), labels.astype("int32")


def _setup_tf(spec):
    """Threads, dtype policy and BN kind, before any TF op runs."""
    import keras

    common.start_runtime(
        intra_op_threads=int(spec["threads"]),
        inter_op_threads=int(spec["inter"]),
        dtype=spec["dtype"],
    )
    keras.utils.set_random_seed(0)
    if spec.get("bn") == "keras":
        _use_keras_batch_norm()
    if spec.get("subsample") == "slice":
        _use_sliced_subsampling()


def _use_sliced_subsampling():
    """Option-A shortcuts subsample by slicing (the old way), not pooling."""
    from tf_resnet.models import blocks

    def subsample(self, x):
        return x[:, :: self.strides, :: self.strides, :]

    blocks.ZeroPadShortcut.subsample = subsample


def _use_keras_batch_norm():
    """Builds models with Keras' unfused BatchNormalization (the old way)."""
    from keras import layers

    from tf_resnet.models import blocks

    def batch_norm(name=None, sync=False):
        return layers.BatchNormalization(
            momentum=blocks.BN_MOMENTUM,
            epsilon=blocks.BN_EPSILON,
            synchronized=sync,
            name=name,
        )

    blocks.batch_norm = batch_norm


def setup_ours(spec):
    import tensorflow as tf

    from tf_resnet import builders, train_loop
    from tf_resnet.config.settings import make_config
    from tf_resnet.distribute import tf_strategy

    _setup_tf(spec)
    data = common.DATA[spec["data"]]
    config = make_config(
        dataset=data["dataset"],
        train_data_path=data["path"],
        model=spec["model"],
        batch_size=int(spec["batch"]),
        xla=bool(int(spec["xla"])),
        weight_decay=float(spec.get("wd", 1e-4)),
        ema_decay=float(spec["ema"]),
    )
    mode = tf_strategy.default_distributor(config.optim)
    model = builders.build_model(
        config, mode, common.training_split(spec["data"])
    )
    optimizer = builders.build_optimizer(
        config, mode, model, total_steps=100_000
    )
    ema = builders.make_ema(config, mode, model)  # None without ema=.
    replica_fn = train_loop.make_replica_fn(model, optimizer, mode, config, ema)
    train_step = mode.make_train_step(replica_fn)
    if spec["input"] == "real":
        iterator = mode.distribute_dataset(
            lambda shards, index, batch: common.build_training_dataset(
                spec["data"], batch, shards, index
            )
        )
    else:  # One fixed batch: the step alone, input costs nothing.
        batch = _fixed_batch(spec)
        iterator = mode.distribute_dataset(
            lambda *_: tf.data.Dataset.from_tensors(batch).repeat()
        )
    steps = int(spec["steps"])

    def run_block():
        for _ in range(steps):
            metrics = train_step(iterator)
        mode.fetch(metrics)  # Waits for the last step.
        return mode.batch.examples(steps)

    _warm_up(run_block)
    return run_block, {"parameters": model.count_params()}


def setup_fit(spec):
    import keras
    import tensorflow as tf

    from tf_resnet import models

    _setup_tf(spec)
    size = common.image_size(spec["data"])
    model = models.build_model(
        spec["model"], common.num_classes(spec["data"]), (size, size, 3)
    )
    optimizer = keras.optimizers.SGD(
        0.01, momentum=0.9, weight_decay=float(spec.get("wd", 1e-4)) or None
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=bool(int(spec["xla"])),
    )
    batch = _fixed_batch(spec)
    dataset = tf.data.Dataset.from_tensors(batch).repeat()
    steps = int(spec["steps"])
    stamps = _BatchEndTimes()

    def run_block():
        # fit's per-call setup (iterator, callbacks) is not part of a step:
        # time from the end of batch 0 to the end of batch `steps`.
        model.fit(
            dataset, steps_per_epoch=steps + 1, verbose=0, callbacks=[stamps]
        )
        seconds = stamps.times[-1] - stamps.times[0]
        return steps * int(spec["batch"]), seconds

    _warm_up(lambda: run_block()[0])
    return run_block, {"parameters": model.count_params()}


class _BatchEndTimes:
    """Records when each `fit` batch ends (a duck-typed Keras callback)."""

    def __new__(cls):
        import keras

        class Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                self.times = []

            def on_train_batch_end(self, batch, logs=None):
                import time

                self.times.append(time.perf_counter())

        return Callback()


def setup_torch(spec):
    import torch
    import torch_resnet

    torch.set_num_threads(int(spec["threads"]))
    if int(spec["inter"]):
        torch.set_num_interop_threads(int(spec["inter"]))
    torch.manual_seed(0)
    model = torch_resnet.build(spec["model"], common.num_classes(spec["data"]))
    images, labels = _fixed_batch(spec)
    images = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    labels = torch.from_numpy(labels).long()
    if spec["layout"] == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    model.train()
    # PyTorch trains in float32 unless asked: "auto" is float32 here.
    train_step = torch_resnet.make_train_step(
        model, bfloat16=spec["dtype"] == "mixed_bfloat16"
    )
    if float(spec["ema"]):
        train_step = _with_torch_ema(train_step, model, float(spec["ema"]))
    steps = int(spec["steps"])

    def run_block():
        for _ in range(steps):
            loss = train_step(images, labels)
        loss.item()
        return steps * int(spec["batch"])

    _warm_up(run_block)
    return run_block, {"parameters": torch_resnet.count_parameters(model)}


def _with_torch_ema(train_step, model, decay):
    """The step followed by the twin's EMA update (`torch_train`'s)."""
    import torch_train

    ema = torch_train.ExponentialMovingAverage(model, decay)

    def step_with_ema(images, labels):
        loss = train_step(images, labels)
        ema.update()
        return loss

    return step_with_ema


def _warm_up(run_block):
    """Two blocks: tracing/compilation, then allocator and kernel caches."""
    run_block()
    run_block()


SETUPS = {"ours": setup_ours, "fit": setup_fit, "torch": setup_torch}


def serve(spec):
    common.serve(lambda: SETUPS[spec["kind"]](spec))


# ---------------------------------------------------------- orchestrator


def check_twins(model_name):
    """Asserts that the PyTorch twin has the Keras model's weight shapes."""
    import torch_resnet

    from tf_resnet import models

    keras_model = models.build_model(model_name, NUM_CLASSES, (32, 32, 3))
    torch_model = torch_resnet.build(model_name, NUM_CLASSES)
    keras_shapes = sorted(tuple(w.shape) for w in keras_model.trainable_weights)
    torch_shapes = torch_resnet.weight_shapes(torch_model)
    assert keras_shapes == torch_shapes, (keras_shapes, torch_shapes)
    count = torch_resnet.count_parameters(torch_model)
    assert count == keras_model.count_params() - sum(
        int(w.numpy().size) for w in keras_model.non_trainable_weights
    ), model_name
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet20,resnet56")
    parser.add_argument(
        "--contenders", default="ours,fit,torch:layout=channels_last,torch"
    )
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--inter", type=int, default=0, help="0: the frameworks' default"
    )
    parser.add_argument(
        "--dtype", default="auto", help="auto: the --dtype default of training"
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="Worker processes per contender. One process can run a few "
        "percent faster or slower than the next with the same settings "
        "(memory layout, oneDNN's choices): with N > 1 every contender gets "
        "N, and its ratio is taken over all their rounds.",
    )
    args = parser.parse_args()
    common.print_environment("training step, images/sec")
    defaults = {
        "batch": args.batch,
        "threads": args.threads,
        "inter": args.inter,
        "dtype": args.dtype,
        "xla": 0,
        "layout": "channels_last",
        "steps": args.steps,
        "data": "cifar10",
        "input": "fixed",
        "ema": 0,
    }
    labels = args.contenders.split(",")
    for model_name in args.models.split(","):
        parameters = check_twins(model_name)
        workers = []
        try:
            for copy in range(args.processes):
                for label in labels:
                    spec = parse_contender(
                        label, {**defaults, "model": model_name}
                    )
                    env = {}
                    if "preload" in spec:
                        env["LD_PRELOAD"] = spec["preload"]
                    if "onednn" in spec:
                        env["TF_ENABLE_ONEDNN_OPTS"] = spec["onednn"]
                    workers.append(
                        common.Worker((label, copy), __file__, spec, env)
                    )
            rates = common.run_side_by_side(workers, args.repetitions)
        finally:
            common.close_all(workers)
        rows = []
        for label in labels:
            mine = [w for w in workers if w.name[0] == label]
            # Ratios pair the rounds of the same process index and round.
            ratio = common.ratio(
                [r for w in mine for r in rates[(labels[0], w.name[1])]],
                [r for w in mine for r in rates[w.name]],
            )
            speeds = common.Stats(r for w in mine for r in rates[w.name])
            warmup = statistics.median(w.info["warmup_s"] for w in mine)
            rows.append(
                [label, speeds.format(), ratio.format(2), f"{warmup:.1f}"]
            )
        common.print_table(
            f"{model_name} ({parameters:,} trainable parameters, asserted "
            f"equal in PyTorch), batch {args.batch}, {args.threads} threads, "
            f"{args.repetitions} rounds x {args.steps} steps x "
            f"{args.processes} process(es) per contender; load "
            f"{common.load_average():.2f} at end",
            [
                "contender",
                "images/sec median (min-max)",
                f"{labels[0]} / this",
                "warm-up s",
            ],
            rows,
        )


if __name__ == "__main__":
    common.run_script(main, serve)

"""`resnet_main.py` with test hooks, for the multi-process tests.

  horovodrun -np 2 -H localhost:2 --gloo python tests/hvd_worker.py \
      --dump_dir=DIR --distribution=horovod ...  # any resnet_main flag
  python -m tf_resnet.launch.tf_config_cluster --np=2 \
      --main=tests/hvd_worker.py -- --dump_dir=DIR ...

* Registers two small models the tests need: `resnet8` (the smallest CIFAR
  ResNet, with BatchNorm: `models.register_resnet8`, which
  `bench/stop_check.py` calls too) and `pointwise_cnn`, a 1x1-conv network
  without BatchNorm whose output depends only on the multiset of pixel
  values. On images whose content stays clear of the 4-pixel crop margin
  it is invariant to the random crop and flip, so runs whose ranks augment
  differently still compute the same gradients.
* Observes the run without changing it, writing into `--dump_dir`:
  `pid_rank<r>.txt` and `first_rank<r>.npz` (weights) after the first step,
  `weights_rank<r>.npz` and `optimizer_rank<r>.npz` (step counter and
  momentum slots) and, with `--ema_decay`, `ema_rank<r>.npz` (the moving
  averages) at the end, one line per checkpoint written by this
  rank in `saves_rank<r>.txt`, and one line per file it wrote through
  `summaries.atomic_write` (CSVs, plots, config.json) in
  `writes_rank<r>.txt`.
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import resnet_main  # noqa: E402
from tf_resnet import models, summaries  # noqa: E402

flags.DEFINE_string("dump_dir", "", "Where each rank writes what it observed.")
FLAGS = flags.FLAGS


def pointwise_cnn(num_classes, input_shape=(32, 32, 3), **options):
    del options
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(8, 1, activation="relu", name="pixel_conv")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="pointwise_cnn")


models.register_resnet8()
models.MODELS["pointwise_cnn"] = pointwise_cnn


def dump_path(name):
    # A Horovod rank (horovodrun's or mpirun's), a worker of a multi_worker
    # TF_CONFIG cluster, or a task of a Slurm job step.
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    index = task.get("index", os.environ.get("SLURM_PROCID", 0))
    index = os.environ.get("OMPI_COMM_WORLD_RANK", index)
    rank = int(os.environ.get("HOROVOD_RANK", index))
    return os.path.join(FLAGS.dump_dir, f"{name}_rank{rank}")


def observe_mode(mode, seen):
    """Wraps `mode.after_step` to keep the model and mark the first step."""
    after_step = mode.after_step

    def after_step_and_observe(step, state):
        after_step(step, state)
        model, optimizer = state.model, state.optimizer
        if "model" not in seen:
            seen.update(model=model, optimizer=optimizer, ema=state.ema)
            np.savez(dump_path("first") + ".npz", *model.get_weights())
            # Written then renamed: the test polls for the file and must
            # never read it half-written.
            pid_path = dump_path("pid") + ".txt"
            with open(pid_path + ".tmp", "w") as stream:
                stream.write(str(os.getpid()))
            os.replace(pid_path + ".tmp", pid_path)

    mode.after_step = after_step_and_observe


def observe_checkpoints():
    save = tf.train.CheckpointManager.save

    def save_and_observe(manager, *args, **kwargs):
        path = save(manager, *args, **kwargs)
        with open(dump_path("saves") + ".txt", "a") as stream:
            stream.write(f"{path}\n")
        return path

    tf.train.CheckpointManager.save = save_and_observe


def observe_writes():
    atomic_write = summaries.atomic_write

    def atomic_write_and_observe(path, *args, **kwargs):
        atomic_write(path, *args, **kwargs)
        with open(dump_path("writes") + ".txt", "a") as stream:
            stream.write(f"{path}\n")

    summaries.atomic_write = atomic_write_and_observe


def run(argv):
    seen = {}
    make_distributor = resnet_main.make_distributor

    def make_observed_mode(*args, **kwargs):
        mode = make_distributor(*args, **kwargs)
        observe_mode(mode, seen)
        return mode

    resnet_main.make_distributor = make_observed_mode
    observe_checkpoints()
    observe_writes()
    code = resnet_main.run(argv)
    if "model" in seen:
        np.savez(dump_path("weights") + ".npz", *seen["model"].get_weights())
        slots = [v.numpy() for v in seen["optimizer"].variables]
        np.savez(dump_path("optimizer") + ".npz", *slots)
        if seen["ema"] is not None:
            averages = [v.numpy() for v in seen["ema"].averages.values()]
            np.savez(dump_path("ema") + ".npz", *averages)
    return code


def main():
    resnet_main.resnet_flags.define_all()
    app.run(lambda argv: sys.exit(run(argv)))


if __name__ == "__main__":
    main()

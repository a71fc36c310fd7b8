"""Trained-and-exported runs and their training models, for the export tests.

The reference a test compares an export with is the training model as the
eval job has it: the run's config from its `config.json`, the model built
by `builders.build_model`, the checkpoint restored by a
`tf.train.Checkpoint` of its own (with the moving average copied in when
the run kept one), and the evaluation pipeline's `finish_batch` in front.
"""

import contextlib
import os
import types

import keras
import numpy as np
import tensorflow as tf

from tests.helpers import run_main
from tf_resnet import builders
from tf_resnet.config import layers as config_lib
from tf_resnet.config import settings
from tf_resnet.data import DATASETS, preprocessing
from tf_resnet.distribute.base import Distributor, TrainState
from tf_resnet.tta import tta_logits


def train(synthetic, log_root, extra, steps=3):
    """Trains `steps` steps on the synthetic data (evaluated at the end)."""
    proc = run_main(
        [
            f"--train_data_path={synthetic['train']}",
            f"--eval_data_path={synthetic['eval']}",
            f"--log_root={log_root}",
            "--batch_size=16",
            "--eval_batch_size=100",
            f"--train_steps={steps}",
            f"--eval_every_steps={steps}",
            *extra,
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def train_and_export(synthetic, root):
    """A run that tells images apart, exported: `(log_root, export_dir)`.

    40 steps (after 3 the BatchNorm moving statistics are still near their
    start and every image gets the same class, which would make comparing
    top-1 classes meaningless), with flip TTA and dataset normalisation
    (which int8 LiteRT quantises fully).
    """
    log_root, export_dir = str(root / "run"), str(root / "export")
    train(
        synthetic,
        log_root,
        ["--eval_tta=flip", "--normalization=dataset"],
        steps=40,
    )
    proc = export(log_root, export_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return log_root, export_dir


def export(log_root, export_dir, *extra):
    """`resnet_main.py --mode=export`; returns the CompletedProcess."""
    return run_main(
        [
            "--mode=export",
            f"--log_root={log_root}",
            f"--export_dir={export_dir}",
            *extra,
        ]
    )


class TrainingModel:
    """The model of a run's checkpoint, as training evaluates it."""

    def __init__(self, log_root, checkpoint=None, use_ema=True):
        self.config = settings.make_config(**config_lib.load_saved(log_root))
        self.plan = config_lib.read_plan(log_root)
        info = types.SimpleNamespace(**self.plan)
        dtype = self._checkpoint_dtype(log_root, checkpoint)
        with _dtype_policy(dtype):
            mode = Distributor(self.config.optim)
            self.model = builders.build_model(self.config, mode, info)
            ema = builders.make_ema(self.config, mode, self.model)
        state = TrainState(self.model, ema=ema)
        path = checkpoint or tf.train.latest_checkpoint(log_root)
        status = tf.train.Checkpoint(**state.checkpoint_objects()).restore(path)
        status.expect_partial().assert_existing_objects_matched()
        if ema is not None and use_ema:
            ema.copy_to(self.model)
        self.has_ema = ema is not None

    @staticmethod
    def _checkpoint_dtype(log_root, checkpoint):
        path = checkpoint or tf.train.latest_checkpoint(log_root)
        dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
        statistic = next(
            name
            for name in dtypes
            if name.startswith("model/") and "moving_mean" in name
        )
        return dtypes[statistic].name

    @property
    def mean_std(self):
        if self.config.data.normalization != "dataset":
            return None, None
        facts = DATASETS[self.config.data.dataset]
        return (
            tuple(255.0 * v for v in facts.mean),
            tuple(255.0 * v for v in facts.std),
        )

    def inputs(self, images):
        """`finish_batch` of uint8 images, as the evaluation pipeline does.

        The pipeline resizes only images whose size differs from the
        model's (`Split.dataset`).
        """
        size = self.plan["image_size"]
        same = images.shape[1] == images.shape[2] == size
        mean, std = self.mean_std
        inputs, _ = preprocessing.finish_batch(
            tf.constant(images),
            tf.zeros([len(images)], tf.int32),
            None,
            pad=0,
            image_size=None if same else size,
            mean=mean,
            std=std,
        )
        return tf.cast(inputs, self.model.inputs[0].dtype)

    def probabilities(self, images, tta=None):
        """Softmax of the run's TTA logits (or `tta`'s) of uint8 images."""
        tta = self.config.optim.eval_tta if tta is None else tta
        logits = tta_logits(self.model, self.inputs(images), tta)
        return tf.nn.softmax(tf.cast(logits, tf.float64)).numpy()


@contextlib.contextmanager
def _dtype_policy(name):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def read_cifar10_records(path):
    """uint8 images `[N, 32, 32, 3]` and labels of a CIFAR-10 binary file."""
    records = np.fromfile(path, np.uint8).reshape(-1, 3073)
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), records[:, 0]


def eval_argmax(log_root, data_path):
    """Top-1 classes of the eval step's pipeline and model for a CIFAR file.

    The evaluation split of `data_path` read by the run's own input
    pipeline (`data.open_split`, `Split.dataset` with the run's options),
    scored by the training model with the run's TTA.
    """
    from tf_resnet import data

    reference = TrainingModel(log_root)
    config = reference.config
    split = data.open_split(
        config.data.dataset, data_path, training=False, source="binary"
    )
    classes = []
    for images, _ in split.dataset(100, data.input_options(config)):
        logits = tta_logits(reference.model, images, config.optim.eval_tta)
        classes.append(np.argmax(logits.numpy(), axis=-1))
    return np.concatenate(classes)


SERVE_SCRIPT = """
import importlib.abc, sys

class NoTfResnet(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tf_resnet":
            raise ImportError("the SavedModel must not need tf_resnet")

sys.meta_path.insert(0, NoTfResnet())
import numpy as np
import tensorflow as tf

model_dir, inputs, outputs = sys.argv[1:]
serve = tf.saved_model.load(model_dir).signatures["serving_default"]
arrays = np.load(inputs)
results = {}
for key in arrays.files:
    out = serve(images=tf.constant(arrays[key]))
    results[key + "/probabilities"] = out["probabilities"].numpy()
    results[key + "/classes"] = out["classes"].numpy()
assert not [m for m in sys.modules if m.startswith("tf_resnet")]
np.savez(outputs, **results)
"""


def serve_in_fresh_process(model_dir, tmp_path, **batches):
    """Runs the SavedModel in a new Python that cannot import tf_resnet.

    Returns:
      `{name: (probabilities, classes)}` for each uint8 batch given.
    """
    import subprocess
    import sys

    inputs = os.path.join(tmp_path, "serve_inputs.npz")
    outputs = os.path.join(tmp_path, "serve_outputs.npz")
    np.savez(inputs, **batches)
    proc = subprocess.run(
        [sys.executable, "-c", SERVE_SCRIPT, model_dir, inputs, outputs],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = np.load(outputs)
    return {
        key: (results[key + "/probabilities"], results[key + "/classes"])
        for key in batches
    }

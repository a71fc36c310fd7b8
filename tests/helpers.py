"""Helpers shared by the tests (fixtures stay in conftest.py).

The scripts of the top-level `data/` folder are not a package (and would
clash with `tf_resnet.data` as a bare `data`): `load_data_script` loads one
by its path under the distinct module name `data_script_<name>`.
"""

import importlib.util
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_resnet import settings
from tf_resnet.data import DATASETS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HAS_HOROVOD = importlib.util.find_spec("horovod") is not None

# Horovod builds against TensorFlow <= 2.18 only, so the newest requirement
# set (requirements-latest.txt) has none; `test_requirement_sets` makes sure
# the pinned set never skips these.
requires_horovod = pytest.mark.skipif(
    not HAS_HOROVOD,
    reason="Horovod is not installed (requirements-latest.txt has none)",
)


def flag_values(log_root):
    """The flags' defaults, with the data paths a run needs, as flat values.

    What `config.resolve` receives from a command line that gives only
    `--train_data_path`, `--eval_data_path` and `--log_root=log_root`.
    """
    values = settings.flatten(settings.Config())
    values.update(
        train_data_path="x", eval_data_path="y", log_root=str(log_root)
    )
    return values


def load_data_script(name):
    """The module of `data/<name>.py`, loaded once per process."""
    module_name = f"data_script_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = os.path.join(ROOT, "data", f"{name}.py")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # Dataclasses look their module up.
    spec.loader.exec_module(module)
    return module


def write_cifar_records(path, dataset, count, seed=0, coarse_offset=3):
    """Writes `count` random records; returns (images [N,32,32,3], labels).

    CIFAR-100 records get a coarse label that differs from the fine one, so a
    reader that takes the wrong byte fails the tests.
    """
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
    num_classes = DATASETS[dataset].num_classes
    labels = rng.integers(0, num_classes, size=count, dtype=np.uint8)
    planes = images.transpose(0, 3, 1, 2).reshape(count, -1)
    if dataset == "cifar10":
        header = labels[:, None]
    else:
        coarse = ((labels.astype(int) + coarse_offset) % 20).astype(np.uint8)
        header = np.stack([coarse, labels], axis=1)
    with open(path, "wb") as stream:
        stream.write(np.concatenate([header, planes], axis=1).tobytes())
    return images, labels


def all_batches(dataset):
    """Every `(images, labels)` batch of `dataset`, joined into two arrays."""
    batches = list(dataset)
    images = np.concatenate([images.numpy() for images, _ in batches])
    labels = np.concatenate([labels.numpy() for _, labels in batches])
    return images, labels


def run_main(args, timeout=300, env=None):
    """Runs resnet_main.py in a subprocess; returns the CompletedProcess."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "resnet_main.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
    )


def run_python(code, *args, timeout=300):
    """Runs `python -c code args` from the repository root; returns stdout.

    For what must start in a fresh process: thread pools, logical devices
    and strategies are fixed once TensorFlow has started.
    """
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def sgd_step(model, optimizer, images, labels):
    """One plain training step: mean cross-entropy, gradients, update."""
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
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


def resnet8_flags(synthetic_cifar, log_root, *extra):
    """Flags of a small BatchNorm network on the synthetic data."""
    return [
        "--dataset=cifar10",
        f"--train_data_path={synthetic_cifar['train']}",
        f"--eval_data_path={synthetic_cifar['eval']}",
        f"--log_root={log_root}",
        "--model=resnet8",
        "--batch_size=32",
        *extra,
    ]

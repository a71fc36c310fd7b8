"""Shared fixtures: small CIFAR files written in the official binary layout."""

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from data import make_synthetic_cifar  # noqa: E402


def write_cifar_records(path, dataset, count, seed=0, coarse_offset=3):
    """Writes `count` random records; returns (images [N,32,32,3], labels).

    CIFAR-100 records get a coarse label that differs from the fine one, so a
    reader that takes the wrong byte fails the tests.
    """
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
    num_classes = 10 if dataset == "cifar10" else 100
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


@pytest.fixture(scope="session")
def synthetic_cifar(tmp_path_factory):
    """The learnable generated dataset of the demo, small: 5x200 + 200."""
    out = tmp_path_factory.mktemp("synthetic")
    folder = make_synthetic_cifar.write_dataset(
        str(out), train_per_batch=200, test_count=200, seed=1
    )
    return {
        "train": os.path.join(folder, "data_batch_*"),
        "eval": os.path.join(folder, "test_batch.bin"),
        "folder": folder,
    }


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

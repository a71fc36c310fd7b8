"""Shared fixtures; the helpers the tests share are in tests/helpers.py."""

import os

import pytest

from tests.exported import train_and_export
from tests.helpers import load_data_script


@pytest.fixture(scope="session")
def synthetic_cifar(tmp_path_factory):
    """The learnable generated dataset of the demo, small: 5x200 + 200."""
    out = tmp_path_factory.mktemp("synthetic")
    folder = load_data_script("make_synthetic_cifar").write_dataset(
        str(out), train_per_batch=200, test_count=200, seed=1
    )
    return {
        "train": os.path.join(folder, "data_batch_*"),
        "eval": os.path.join(folder, "test_batch.bin"),
        "folder": folder,
    }


@pytest.fixture(scope="session")
def exported_run(synthetic_cifar, tmp_path_factory):
    """`(log_root, export_dir)` of a 40-step run that tells images apart.

    Shared by the predict and LiteRT tests: trained once per worker.
    """
    return train_and_export(synthetic_cifar, tmp_path_factory.mktemp("run40"))

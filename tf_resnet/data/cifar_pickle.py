"""Reader for the official CIFAR-10 / CIFAR-100 *python* (pickle) files.

Files (https://www.cs.toronto.edu/~kriz/cifar.html), Python 2 pickles:

* CIFAR-10 (`cifar-10-batches-py/data_batch_1..5`, `test_batch`): a dict
  with `data` (uint8 array `[N, 3072]`) and `labels` (list of N ints); the
  class names are `label_names` of `batches.meta`;
* CIFAR-100 (`cifar-100-python/train`, `test`): `data`, `fine_labels` and
  `coarse_labels`. We train on the FINE labels, named by `fine_label_names`
  of `meta`.

Each row of `data` holds three 32x32 planes, R then G then B, row-major.

A pickle can run any code while it loads, so the files are read with
`RestrictedUnpickler`: besides the built-in containers, which need no
lookup, it admits only the three numpy names an array is rebuilt from. A
file that asks for anything else (e.g. `os.system` through `__reduce__`) is
refused with a `DataError` before that object is ever called.

The files are loaded (and checked) once, when the split is opened; the
split keeps the arrays in memory for its input pipelines.
"""

import os
import pickle

import numpy as np
import tensorflow as tf

from tf_resnet.config.datasets import DATASETS
from tf_resnet.data.cifar_binary import list_files
from tf_resnet.data.split import Split
from tf_resnet.errors import DataError

LABEL_KEYS = {"cifar10": "labels", "cifar100": "fine_labels"}
# The pickle next to the data that names the classes, and its key.
NAMES = {
    "cifar10": ("batches.meta", "label_names"),
    "cifar100": ("meta", "fine_label_names"),
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler for numpy arrays, lists, dicts, bytes and numbers only."""

    ALLOWED = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),  # Written by numpy 1.
            ("numpy._core.multiarray", "_reconstruct"),  # Written by numpy 2.
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
        }
    )

    def find_class(self, module, name):
        """Returns an allowed global; refuses every other one."""
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: a CIFAR file holds only "
                "arrays, lists and strings"
            )
        return super().find_class(module, name)


def _unpickle(path):
    """A CIFAR pickle's dict, with `str` keys.

    Raises:
      DataError: naming `path` when it is missing, not a pickle, not a dict
        or asks for code to run.
    """
    try:
        with open(path, "rb") as stream:
            batch = RestrictedUnpickler(stream, encoding="bytes").load()
    except Exception as error:  # Any failure here means "not a CIFAR file".
        raise DataError(
            f"{path}: not a CIFAR python pickle ({error})"
        ) from error
    if not isinstance(batch, dict):
        raise DataError(f"{path}: not a CIFAR batch (holds no dict)")
    # Python 2 strings load as bytes; files re-saved by Python 3 have str.
    return {_text(key): value for key, value in batch.items()}


def load_file(path, dataset):
    """One pickle file -> uint8 images `[N, 32, 32, 3]`, int32 labels `[N]`.

    Raises:
      DataError: naming `path` when it is missing, not a CIFAR pickle of
        `dataset`, asks for code to run, or has labels out of range.
    """
    batch = _unpickle(path)
    size = DATASETS[dataset].image_size
    image_bytes = size * size * 3
    num_classes = DATASETS[dataset].num_classes
    label_key = LABEL_KEYS[dataset]
    if "data" not in batch or label_key not in batch:
        raise DataError(
            f"{path}: needs 'data' and {label_key!r} entries for {dataset}, "
            f"has {sorted(map(str, batch))}"
        )
    data = batch["data"]
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != image_bytes
    ):
        raise DataError(
            f"{path}: 'data' must be a uint8 array [N, {image_bytes}], got "
            f"{getattr(data, 'dtype', type(data).__name__)} "
            f"{getattr(data, 'shape', '')}"
        )
    labels = np.asarray(batch[label_key])
    if labels.shape != (len(data),) or labels.dtype.kind not in "iu":
        raise DataError(
            f"{path}: {len(data)} images but labels of shape {labels.shape}"
        )
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        raise DataError(
            f"{path}: image {bad[0]} has label {labels[bad[0]]}, outside "
            f"[0, {num_classes}) for {dataset}"
        )
    images = data.reshape(-1, 3, size, size).transpose(0, 2, 3, 1)
    return images, labels.astype(np.int32)


def _text(key):
    return key.decode("latin-1") if isinstance(key, bytes) else key


def load_files(files, dataset):
    """All `files`, concatenated in the given order."""
    loaded = [load_file(path, dataset) for path in files]
    images = np.concatenate([images for images, _ in loaded])
    labels = np.concatenate([labels for _, labels in loaded])
    return images, labels


def read_class_names(folder, dataset):
    """Class names from the meta pickle next to the data, or `None`."""
    name, key = NAMES[dataset]
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return None
    meta = _unpickle(path)
    names = meta.get(key)
    num_classes = DATASETS[dataset].num_classes
    if not isinstance(names, list) or len(names) != num_classes:
        raise DataError(
            f"{path}: {key!r} must list the {num_classes} class names of "
            f"{dataset}"
        )
    return [_text(name) for name in names]


class PickleSplit(Split):
    """CIFAR python pickles, loaded into memory when opened."""

    source = "pickle"

    def __init__(self, dataset_name, path, training, *, files=None):
        files = files or list_files(path)
        self.images, self.labels = load_files(files, dataset_name)
        super().__init__(
            dataset_name,
            path,
            training,
            num_examples=len(self.labels),
            class_names=read_class_names(
                os.path.dirname(files[0]), dataset_name
            ),
        )

    def table(self):
        return tf.data.Dataset.from_tensors(
            {"image": self.images, "label": self.labels}
        )

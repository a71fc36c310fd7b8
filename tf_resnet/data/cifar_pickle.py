"""Reader for the official CIFAR-10 / CIFAR-100 *python* (pickle) files.

Files (https://www.cs.toronto.edu/~kriz/cifar.html), Python 2 pickles:

* CIFAR-10 (`cifar-10-batches-py/data_batch_1..5`, `test_batch`): a dict
  with `data` (uint8 array `[N, 3072]`) and `labels` (list of N ints);
* CIFAR-100 (`cifar-100-python/train`, `test`): `data`, `fine_labels` and
  `coarse_labels`. We train on the FINE labels.

Each row of `data` holds three 32x32 planes, R then G then B, row-major.

A pickle can run any code while it loads, so the files are read with
`RestrictedUnpickler`: besides the built-in containers, which need no
lookup, it admits only the three numpy names an array is rebuilt from. A
file that asks for anything else (e.g. `os.system` through `__reduce__`) is
refused with a `DataError` before that object is ever called.
"""

import pickle

import numpy as np
import tensorflow as tf

from tf_resnet.data import cifar_binary, pipeline
from tf_resnet.errors import DataError

IMAGE_SIZE = 32
IMAGE_BYTES = IMAGE_SIZE * IMAGE_SIZE * 3
LABEL_KEYS = {"cifar10": "labels", "cifar100": "fine_labels"}
NUM_CLASSES = {"cifar10": 10, "cifar100": 100}


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


def load_file(path, dataset):
    """One pickle file -> uint8 images `[N, 32, 32, 3]`, int32 labels `[N]`.

    Raises:
      DataError: naming `path` when it is missing, not a CIFAR pickle of
        `dataset`, asks for code to run, or has labels out of range.
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
    batch = {_text(key): value for key, value in batch.items()}
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
        or data.shape[1] != IMAGE_BYTES
    ):
        raise DataError(
            f"{path}: 'data' must be a uint8 array [N, {IMAGE_BYTES}], got "
            f"{getattr(data, 'dtype', type(data).__name__)} "
            f"{getattr(data, 'shape', '')}"
        )
    labels = np.asarray(batch[label_key])
    if labels.shape != (len(data),) or labels.dtype.kind not in "iu":
        raise DataError(
            f"{path}: {len(data)} images but labels of shape {labels.shape}"
        )
    bad = np.flatnonzero((labels < 0) | (labels >= NUM_CLASSES[dataset]))
    if bad.size:
        raise DataError(
            f"{path}: image {bad[0]} has label {labels[bad[0]]}, outside "
            f"[0, {NUM_CLASSES[dataset]}) for {dataset}"
        )
    images = data.reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE).transpose(0, 2, 3, 1)
    return images, labels.astype(np.int32)


def _text(key):
    return key.decode("latin-1") if isinstance(key, bytes) else key


def load_files(file_pattern, dataset):
    """All files of a glob, concatenated in sorted file order."""
    loaded = [
        load_file(path, dataset)
        for path in cifar_binary.list_files(file_pattern)
    ]
    images = np.concatenate([images for images, _ in loaded])
    labels = np.concatenate([labels for _, labels in loaded])
    return images, labels


def build(dataset, file_pattern, training, batch_size, **options):
    """`tf.data.Dataset` of CIFAR pickle files; see `data.build_dataset`."""
    images, labels = load_files(file_pattern, dataset)
    options.setdefault("cache", False)  # Already in memory.
    elements = tf.data.Dataset.from_tensor_slices(
        {"image": images, "label": labels}
    )
    return pipeline.make_image_pipeline(
        elements,
        native_size=IMAGE_SIZE,
        training=training,
        batch_size=batch_size,
        **options,
    )


def num_examples(dataset, file_pattern):
    """Images in the files matching `file_pattern` (validated)."""
    return len(load_files(file_pattern, dataset)[1])

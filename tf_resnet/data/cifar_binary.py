"""Reader for the official CIFAR-10 / CIFAR-100 *binary* files.

Record layouts (https://www.cs.toronto.edu/~kriz/cifar.html):

* CIFAR-10  (`cifar-10-batches-bin/data_batch_*.bin`): 1 label byte, then
  3072 pixel bytes.
* CIFAR-100 (`cifar-100-binary/train.bin`): 1 coarse label byte, 1 FINE label
  byte, then 3072 pixel bytes. We train on the fine label (byte 1); the Ray
  example read byte 0, the coarse label, which is the bug not to repeat.

Pixels are three 32x32 planes, R then G then B, each row-major.

Every file is checked before training starts: it must exist, hold a whole
number of records and carry labels inside the class range. Each problem is a
`DataError` naming the file.
"""

import dataclasses
import glob
import os

import numpy as np
import tensorflow as tf

from tf_resnet.data import pipeline
from tf_resnet.errors import DataError

IMAGE_SIZE = 32
IMAGE_BYTES = IMAGE_SIZE * IMAGE_SIZE * 3


@dataclasses.dataclass(frozen=True)
class RecordFormat:
    """Where the label sits in a fixed-length record."""

    name: str
    num_classes: int
    label_offset: int
    label_bytes: int

    @property
    def record_bytes(self):
        return self.label_bytes + IMAGE_BYTES


FORMATS = {
    "cifar10": RecordFormat("cifar10", 10, label_offset=0, label_bytes=1),
    "cifar100": RecordFormat("cifar100", 100, label_offset=1, label_bytes=2),
}


def list_files(file_pattern):
    """Sorted files matching a glob (or comma-separated globs)."""
    files = []
    for pattern in str(file_pattern).split(","):
        files.extend(glob.glob(os.path.expanduser(pattern.strip())))
    if not files:
        raise DataError(f"{file_pattern}: no file matches this pattern")
    return sorted(files)


def validate_files(files, fmt):
    """Checks sizes and labels of every file; returns the record count.

    Raises:
      DataError: naming the first file that is empty, not a whole number of
        records, or holds a label outside `[0, num_classes)`.
    """
    total = 0
    for path in files:
        if os.path.isdir(path):
            raise DataError(f"{path}: is a directory, expected a CIFAR file")
        size = os.path.getsize(path)
        if size == 0:
            raise DataError(f"{path}: file is empty")
        if size % fmt.record_bytes:
            raise DataError(
                f"{path}: {size} bytes is not a whole number of "
                f"{fmt.record_bytes}-byte {fmt.name} records"
                f"{_format_hint(size, fmt)}"
            )
        records = np.memmap(path, dtype=np.uint8, mode="r")
        labels = records.reshape(-1, fmt.record_bytes)[:, fmt.label_offset]
        bad = np.flatnonzero(labels >= fmt.num_classes)
        if bad.size:
            raise DataError(
                f"{path}: record {bad[0]} has label {labels[bad[0]]}, outside "
                f"[0, {fmt.num_classes}) for {fmt.name}"
                f"{_format_hint(size, fmt)}"
            )
        total += size // fmt.record_bytes
    return total


def _format_hint(size, fmt):
    """Suggests the other CIFAR format when the file fits it."""
    for other in FORMATS.values():
        if other is not fmt and size % other.record_bytes == 0:
            return (
                f" (it divides into {other.record_bytes}-byte {other.name} "
                f"records: did you mean --dataset={other.name}?)"
            )
    return ""


def _decode_batch(records, fmt):
    """Raw record strings `[B]` -> uint8 images `[B,32,32,3]`, labels `[B]`."""
    raw = tf.io.decode_raw(records, tf.uint8)
    labels = raw[:, fmt.label_offset]
    planes = tf.reshape(raw[:, fmt.label_bytes :], [-1, 3, 32, 32])
    return tf.transpose(planes, [0, 2, 3, 1]), labels


def build(dataset, file_pattern, training, batch_size, **options):
    """`tf.data.Dataset` of CIFAR binary records; see `data.build_dataset`."""
    fmt = FORMATS[dataset]
    files = list_files(file_pattern)
    validate_files(files, fmt)
    elements = tf.data.FixedLengthRecordDataset(files, fmt.record_bytes)
    options.setdefault("cache", True)
    return pipeline.make_image_pipeline(
        elements,
        native_size=IMAGE_SIZE,
        training=training,
        batch_size=batch_size,
        to_images=lambda records: _decode_batch(records, fmt),
        **options,
    )


def num_examples(dataset, file_pattern):
    """Records in the files matching `file_pattern` (validated)."""
    return validate_files(list_files(file_pattern), FORMATS[dataset])

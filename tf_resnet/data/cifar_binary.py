"""Reader for the official CIFAR-10 / CIFAR-100 *binary* files.

Record layouts (https://www.cs.toronto.edu/~kriz/cifar.html):

* CIFAR-10  (`cifar-10-batches-bin/data_batch_*.bin`): 1 label byte, then
  3072 pixel bytes; the class names are in `batches.meta.txt`.
* CIFAR-100 (`cifar-100-binary/train.bin`): 1 coarse label byte, 1 FINE label
  byte, then 3072 pixel bytes. We train on the fine label (byte 1) and take
  the pixels from byte 2. The Ray example's CIFAR-100 reader also read the
  fine label at byte 1, but took its pixels from byte 1 as well, one byte
  early: every image was shifted by one byte (its first byte the fine
  label) and lost its last pixel byte. The fine class names are in
  `fine_label_names.txt`.

Pixels are three 32x32 planes, R then G then B, each row-major.

Every file is checked when the split is opened: it must exist, hold a whole
number of records and carry labels inside the class range. Each problem is a
`DataError` naming the file.
"""

import dataclasses
import glob
import os

import numpy as np
import tensorflow as tf

from tf_resnet.config.datasets import DATASETS
from tf_resnet.data.split import Split
from tf_resnet.errors import DataError

# Every pickle of protocol 2 or later (all CIFAR python files) starts with
# the PROTO opcode 0x80; a CIFAR binary starts with a label byte below 100.
PICKLE_START = b"\x80"


@dataclasses.dataclass(frozen=True)
class RecordFormat:
    """Where the label sits in a fixed-length record."""

    name: str
    label_offset: int
    label_bytes: int
    names_file: str

    @property
    def num_classes(self):
        return DATASETS[self.name].num_classes

    @property
    def record_bytes(self):
        size = DATASETS[self.name].image_size
        return self.label_bytes + size * size * 3


FORMATS = {
    "cifar10": RecordFormat(
        "cifar10", label_offset=0, label_bytes=1, names_file="batches.meta.txt"
    ),
    "cifar100": RecordFormat(
        "cifar100",
        label_offset=1,
        label_bytes=2,
        names_file="fine_label_names.txt",
    ),
}


def list_files(file_pattern):
    """Sorted files matching a glob (or comma-separated globs)."""
    files = []
    for pattern in str(file_pattern).split(","):
        files.extend(glob.glob(os.path.expanduser(pattern.strip())))
    if not files:
        raise DataError(f"{file_pattern}: no file matches this pattern")
    return sorted(files)


def starts_like_pickle(path):
    """Whether the file at `path` starts like a python pickle."""
    with open(path, "rb") as stream:
        return stream.read(len(PICKLE_START)) == PICKLE_START


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
                f"{_format_hint(path, size, fmt)}"
            )
        records = np.memmap(path, dtype=np.uint8, mode="r")
        labels = records.reshape(-1, fmt.record_bytes)[:, fmt.label_offset]
        bad = np.flatnonzero(labels >= fmt.num_classes)
        if bad.size:
            raise DataError(
                f"{path}: record {bad[0]} has label {labels[bad[0]]}, outside "
                f"[0, {fmt.num_classes}) for {fmt.name}"
                f"{_format_hint(path, size, fmt)}"
            )
        total += size // fmt.record_bytes
    return total


def _format_hint(path, size, fmt):
    """Suggests the format the file seems to be in instead."""
    if starts_like_pickle(path):
        return (
            " (it starts like a python pickle: leave --data_source unset or "
            "pass --data_source=pickle)"
        )
    for other in FORMATS.values():
        if other is not fmt and size % other.record_bytes == 0:
            return (
                f" (it divides into {other.record_bytes}-byte {other.name} "
                f"records: did you mean --dataset={other.name}?)"
            )
    return ""


def read_class_names(folder, fmt):
    """Class names from the text file next to the data, or `None`."""
    path = os.path.join(folder, fmt.names_file)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as stream:
        names = [line.strip() for line in stream if line.strip()]
    if len(names) != fmt.num_classes:
        raise DataError(
            f"{path}: lists {len(names)} class names, {fmt.name} has "
            f"{fmt.num_classes}"
        )
    return names


def _decode_batch(records, fmt):
    """Raw record strings `[B]` -> uint8 images `[B,32,32,3]`, labels `[B]`.

    The records hold the three colour planes one after the other; they are
    stacked as the last axis rather than transposed: TensorFlow's oneDNN
    graph pass logs a false error ("oneDNN supports DT_UINT8 only on
    platforms with AVX-512") for a uint8 transpose, on every CPU.
    """
    size = DATASETS[fmt.name].image_size
    raw = tf.io.decode_raw(records, tf.uint8)
    labels = raw[:, fmt.label_offset]
    planes = tf.reshape(raw[:, fmt.label_bytes :], [-1, 3, size, size])
    images = tf.stack([planes[:, 0], planes[:, 1], planes[:, 2]], axis=-1)
    return images, labels


class BinarySplit(Split):
    """CIFAR binary files, read whole into each pipeline's table.

    The table is the raw records (150 MB for CIFAR-10's training split),
    read with TensorFlow's own record reader when the pipeline starts, so
    every epoch after the first reads no file.
    """

    source = "binary"

    def __init__(self, dataset_name, path, training, *, files=None):
        self.format = FORMATS[dataset_name]
        self.files = files or list_files(path)
        super().__init__(
            dataset_name,
            path,
            training,
            num_examples=validate_files(self.files, self.format),
            class_names=read_class_names(
                os.path.dirname(self.files[0]), self.format
            ),
        )

    def table(self):
        records = tf.data.FixedLengthRecordDataset(
            self.files, self.format.record_bytes
        )
        return records.batch(self.num_examples).map(
            lambda batch: {"record": batch}
        )

    def decode_batch(self, batch):
        return _decode_batch(batch["record"], self.format)

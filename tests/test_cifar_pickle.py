"""The CIFAR python-pickle reader, on files written like the official ones."""

import os
import pickle
import shlex
import struct

import numpy as np
import pytest
import tensorflow as tf
from conftest import all_batches

from tf_resnet import data
from tf_resnet.data import cifar_pickle
from tf_resnet.errors import DataError


def _py2_str(raw):
    """A Python 2 `str`, as cPickle wrote it (SHORT_BINSTRING/BINSTRING)."""
    if len(raw) < 256:
        return b"U" + bytes([len(raw)]) + raw
    return b"T" + struct.pack("<i", len(raw)) + raw


def _py2_int(value):
    return (
        b"K" + bytes([value])
        if value < 256
        else b"J" + struct.pack("<i", value)
    )


def _py2_uint8_array(array):
    """A uint8 ndarray exactly as numpy 1 on Python 2 pickled it."""
    shape = b"(" + b"".join(_py2_int(n) for n in array.shape) + b"t"
    dtype = (
        b"cnumpy\ndtype\n" + _py2_str(b"u1") + b"K\x00K\x01\x87R"
        b"(K\x03"
        + _py2_str(b"|")
        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    )
    return (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
        b"K\x00\x85" + _py2_str(b"b") + b"\x87R"
        b"(K\x01" + shape + dtype + b"\x89" + _py2_str(array.tobytes()) + b"tb"
    )


def _py2_value(value):
    if isinstance(value, np.ndarray):
        return _py2_uint8_array(value)
    if isinstance(value, bytes):
        return _py2_str(value)
    if isinstance(value, int):
        return _py2_int(value)
    items = b"".join(_py2_value(item) for item in value)
    return b"](" + items + b"e"


def write_py2_pickle(path, batch):
    """Writes `{bytes: array | list | bytes}` as a protocol-2 Python 2 file."""
    items = b"".join(_py2_str(k) + _py2_value(v) for k, v in batch.items())
    with open(path, "wb") as stream:
        stream.write(b"\x80\x02}(" + items + b"u.")


def write_cifar_pickle(path, dataset, count, seed=0, label_shift=0):
    """Random images in the official layout; returns (images, labels)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)
    num_classes = 10 if dataset == "cifar10" else 100
    labels = [int(x) + label_shift for x in rng.integers(0, num_classes, count)]
    batch = {
        b"batch_label": b"training batch 1 of 5",
        b"data": images.transpose(0, 3, 1, 2).reshape(count, 3072),
        b"filenames": [b"img_%d.png" % i for i in range(count)],
    }
    if dataset == "cifar10":
        batch[b"labels"] = labels
    else:
        batch[b"fine_labels"] = labels
        batch[b"coarse_labels"] = [(x + 7) % 20 for x in labels]
    write_py2_pickle(path, batch)
    return images, np.array(labels)


def test_writer_matches_the_official_file_header(tmp_path):
    # The first bytes of cifar-10-batches-py/data_batch_1, memo opcodes
    # aside: a dict whose 'data' is rebuilt by numpy's _reconstruct.
    path = tmp_path / "data_batch_1"
    write_py2_pickle(path, {b"data": np.zeros((1, 3072), np.uint8)})
    head = path.read_bytes()[:64]
    assert head.startswith(b"\x80\x02}(U\x04data")
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in head


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_reader_returns_raw_pixels_and_labels_in_file_order(tmp_path, dataset):
    if dataset == "cifar10":
        names = ["data_batch_2", "data_batch_1"]
    else:
        names = ["train"]
    written = {
        name: write_cifar_pickle(tmp_path / name, dataset, 5 + i, seed=i)
        for i, name in enumerate(names)
    }
    raw_images = np.concatenate([written[n][0] for n in sorted(names)])
    raw_labels = np.concatenate([written[n][1] for n in sorted(names)])
    pattern = str(
        tmp_path / ("data_batch_*" if dataset == "cifar10" else "train")
    )

    images, labels = cifar_pickle.load_files(pattern, dataset)
    np.testing.assert_array_equal(images, raw_images)
    np.testing.assert_array_equal(labels, raw_labels)  # Fine labels.

    out_images, out_labels = all_batches(
        data.build_dataset(dataset, pattern, False, 4, source="pickle")
    )
    np.testing.assert_array_equal(out_labels, raw_labels)
    np.testing.assert_allclose(
        out_images, tf.image.per_image_standardization(raw_images), atol=1e-5
    )
    assert data.num_examples(dataset, pattern, "pickle") == len(raw_labels)


def test_training_batches_resume_like_an_uninterrupted_run(tmp_path):
    write_cifar_pickle(tmp_path / "data_batch_1", "cifar10", 20)
    pattern = str(tmp_path / "data_batch_*")

    def batches(start_step, count):
        dataset = data.build_dataset(
            "cifar10",
            pattern,
            True,
            4,
            source="pickle",
            seed=1,
            start_step=start_step,
        )
        return [images.numpy() for images, _ in dataset.take(count)]

    fresh, resumed = batches(0, 4), batches(3, 1)
    assert fresh[0].shape == (4, 32, 32, 3)
    np.testing.assert_array_equal(resumed[0], fresh[3])


class _RunsCommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "command_ran"
    path = tmp_path / "data_batch_1"
    batch = {"data": _RunsCommand(marker), "labels": [1]}
    path.write_bytes(pickle.dumps(batch))
    with pytest.raises(
        DataError, match=r"refusing to load \w+\.system"
    ) as error:
        data.build_dataset("cifar10", str(path), True, 1, source="pickle")
    assert str(path) in str(error.value)
    assert not marker.exists()
    pickle.loads(path.read_bytes())  # The same file run unrestricted...
    assert marker.exists()  # ...does run the command: the test is real.


@pytest.mark.parametrize(
    "dataset, batch, message",
    [
        (
            "cifar10",
            {b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 10]},
            "label 10, outside",
        ),
        (
            "cifar100",
            {b"data": np.zeros((1, 3072), np.uint8), b"fine_labels": [100]},
            "label 100, outside",
        ),
        (
            "cifar100",
            {b"data": np.zeros((1, 3072), np.uint8), b"labels": [1]},
            "fine_labels",
        ),
        (
            "cifar10",
            {b"data": np.zeros((2, 3000), np.uint8), b"labels": [1, 2]},
            "3072",
        ),
        (
            "cifar10",
            {b"data": np.zeros((2, 3072), np.uint8), b"labels": [1]},
            "2 images but labels",
        ),
    ],
)
def test_bad_content_is_a_data_error_naming_the_file(
    tmp_path, dataset, batch, message
):
    path = tmp_path / "test_batch"
    write_py2_pickle(path, batch)
    with pytest.raises(DataError, match=message) as error:
        data.num_examples(dataset, str(path), "pickle")
    assert str(path) in str(error.value)


def test_not_a_pickle_and_no_match_are_data_errors(tmp_path):
    path = tmp_path / "data_batch_1"
    path.write_bytes(b"\x00" * 3073)  # A CIFAR binary record, say.
    with pytest.raises(DataError, match="not a CIFAR python pickle"):
        data.num_examples("cifar10", str(path), "pickle")
    with pytest.raises(DataError, match="no file matches"):
        data.num_examples("cifar10", str(tmp_path / "nothing*"), "pickle")

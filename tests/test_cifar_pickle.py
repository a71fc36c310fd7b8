"""The CIFAR python-pickle reader, on files written like the official ones."""

import os
import pickle
import shlex

import numpy as np
import pytest
import tensorflow as tf

from tests.data_files import write_cifar_records, write_py2_pickle
from tests.helpers import all_batches
from tf_resnet import data
from tf_resnet.errors import DataError, UserInputError


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

    split = data.open_split(dataset, pattern, training=False)
    assert split.source == "pickle"  # Inferred from the first bytes.
    np.testing.assert_array_equal(split.images, raw_images)
    np.testing.assert_array_equal(split.labels, raw_labels)  # Fine labels.

    out_images, out_labels = all_batches(split.dataset(4))
    np.testing.assert_array_equal(out_labels, raw_labels)
    np.testing.assert_allclose(
        out_images, tf.image.per_image_standardization(raw_images), atol=1e-5
    )
    assert split.num_examples == len(raw_labels)


def test_training_batches_resume_like_an_uninterrupted_run(tmp_path):
    write_cifar_pickle(tmp_path / "data_batch_1", "cifar10", 20)
    pattern = str(tmp_path / "data_batch_*")

    def batches(start_step, count):
        split = data.open_split("cifar10", pattern, training=True)
        dataset = split.dataset(
            4, data.InputOptions(seed=1, start_step=start_step)
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
        data.open_split("cifar10", str(path), training=True, source="pickle")
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
        data.open_split(dataset, str(path), training=False)
    assert str(path) in str(error.value)


def test_not_a_pickle_and_no_match_are_data_errors(tmp_path):
    path = tmp_path / "data_batch_1"
    path.write_bytes(b"\x00" * 3073)  # A CIFAR binary record, say.
    with pytest.raises(DataError, match="not a CIFAR python pickle"):
        data.open_split("cifar10", str(path), training=True, source="pickle")
    with pytest.raises(DataError, match="no file matches"):
        data.open_split("cifar10", str(tmp_path / "nothing*"), training=True)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_source_is_told_apart_by_the_first_bytes(tmp_path, dataset):
    # Same names, no extension: only the content tells the formats apart.
    (tmp_path / "py").mkdir()
    (tmp_path / "bin").mkdir()
    pickled, _ = write_cifar_pickle(tmp_path / "py" / "test_batch", dataset, 3)
    binary, _ = write_cifar_records(tmp_path / "bin" / "test_batch", dataset, 4)
    for folder, images in (("py", pickled), ("bin", binary)):
        split = data.open_split(
            dataset, str(tmp_path / folder / "test_batch"), training=False
        )
        assert split.source == {"py": "pickle", "bin": "binary"}[folder]
        got, _ = all_batches(split.dataset(2))
        np.testing.assert_allclose(
            got, tf.image.per_image_standardization(images), atol=1e-5
        )


def test_pickle_read_as_binary_says_what_it_looks_like(tmp_path):
    write_cifar_pickle(tmp_path / "data_batch_1", "cifar10", 2)
    with pytest.raises(DataError, match="starts like a python pickle"):
        data.open_split(
            "cifar10",
            str(tmp_path / "data_batch_1"),
            training=True,
            source="binary",
        )


def test_cifar_folder_is_refused_with_a_hint(tmp_path):
    with pytest.raises(DataError, match="data_source=tfds") as error:
        data.open_split("cifar10", str(tmp_path), training=True)
    assert str(tmp_path) in str(error.value)
    with pytest.raises(UserInputError, match="its sources: binary, pickle"):
        data.open_split(
            "cifar10", str(tmp_path), training=True, source="folder"
        )


@pytest.mark.parametrize(
    "dataset, meta, key",
    [
        ("cifar10", "batches.meta", b"label_names"),
        ("cifar100", "meta", b"fine_label_names"),
    ],
)
def test_class_names_come_from_the_meta_pickle(tmp_path, dataset, meta, key):
    write_cifar_pickle(tmp_path / "test", dataset, 2)
    pattern = str(tmp_path / "test")
    assert data.open_split(dataset, pattern, training=False).class_names is None
    count = data.DATASETS[dataset].num_classes
    names = [b"name_%d" % i for i in range(count)]
    extra = (
        {b"coarse_label_names": [b"c"] * 20} if dataset == "cifar100" else {}
    )
    write_py2_pickle(tmp_path / meta, {key: names, b"num_vis": 3072, **extra})
    split = data.open_split(dataset, pattern, training=False)
    assert split.class_names == [name.decode() for name in names]
    write_py2_pickle(tmp_path / meta, {key: names[:3]})
    with pytest.raises(DataError, match=f"class names of {dataset}") as error:
        data.open_split(dataset, pattern, training=False)
    assert str(tmp_path / meta) in str(error.value)

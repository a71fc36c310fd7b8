"""The CIFAR binary reader against the raw bytes it reads."""

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import write_cifar_records

from tf_resnet.data import build_dataset, num_examples
from tf_resnet.errors import DataError


def standardized(images):
    """numpy twin of tf.image.per_image_standardization."""
    x = images.astype(np.float64)
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    std = x.std(axis=(1, 2, 3), keepdims=True)
    return (x - mean) / np.maximum(std, 1.0 / np.sqrt(x[0].size))


def collect(dataset):
    images, labels = zip(
        *[(x.numpy(), y.numpy()) for x, y in dataset], strict=True
    )
    return np.concatenate(images), np.concatenate(labels)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_eval_reader_matches_raw_bytes_in_file_order(tmp_path, dataset):
    first = write_cifar_records(tmp_path / "b_1.bin", dataset, 37, seed=1)
    second = write_cifar_records(tmp_path / "b_2.bin", dataset, 20, seed=2)
    images, labels = collect(
        build_dataset(dataset, str(tmp_path / "b_*.bin"), False, 16)
    )
    expected_images = np.concatenate([first[0], second[0]])
    expected_labels = np.concatenate([first[1], second[1]])
    np.testing.assert_array_equal(labels, expected_labels)  # Fine labels.
    np.testing.assert_allclose(images, standardized(expected_images), atol=1e-4)
    assert images.dtype == np.float32 and labels.dtype == np.int32
    assert num_examples(dataset, str(tmp_path / "b_*.bin")) == 57


def test_training_stream_is_deterministic_and_resumable(tmp_path):
    write_cifar_records(tmp_path / "t.bin", "cifar10", 50)
    pattern = str(tmp_path / "t.bin")

    def batches(start_step, count, seed=7):
        ds = build_dataset(
            "cifar10",
            pattern,
            True,
            8,
            seed=seed,
            start_step=start_step,
            shuffle_buffer=64,
        )
        return [(x.numpy(), y.numpy()) for x, y in ds.take(count)]

    full = batches(0, 12)
    resumed = batches(9, 3)
    for (a_img, a_lab), (b_img, b_lab) in zip(full[9:], resumed, strict=True):
        np.testing.assert_array_equal(a_lab, b_lab)
        np.testing.assert_array_equal(a_img, b_img)
    other_seed = batches(0, 1, seed=8)
    assert not np.array_equal(full[0][0], other_seed[0][0])
    assert full[0][0].shape == (8, 32, 32, 3)


def test_training_augmentation_crops_and_flips_the_original(tmp_path):
    images, labels = write_cifar_records(tmp_path / "t.bin", "cifar10", 16)
    ds = build_dataset(
        "cifar10", str(tmp_path / "t.bin"), True, 16, shuffle_buffer=1, pad=0
    )
    got, got_labels = next(iter(ds))
    np.testing.assert_array_equal(got_labels.numpy(), labels)
    expected = standardized(images)
    flipped = standardized(images[:, :, ::-1])
    for index in range(16):
        matches = [
            np.allclose(got[index], e[index], atol=1e-4)
            for e in (expected, flipped)
        ]
        assert any(matches)


def test_shards_partition_the_eval_records(tmp_path):
    _, labels = write_cifar_records(tmp_path / "t.bin", "cifar10", 23)
    parts = [
        collect(
            build_dataset(
                "cifar10",
                str(tmp_path / "t.bin"),
                False,
                5,
                num_shards=2,
                shard_index=i,
            )
        )[1]
        for i in (0, 1)
    ]
    np.testing.assert_array_equal(parts[0], labels[0::2])
    np.testing.assert_array_equal(parts[1], labels[1::2])


def _read(path):
    with open(path, "rb") as stream:
        return stream.read()


def _write(path, data):
    with open(path, "wb") as stream:
        stream.write(data)
    return str(path)


@pytest.mark.parametrize(
    "case, dataset, expected",
    [
        ("no_match", "cifar10", "no file matches"),
        ("empty", "cifar10", "file is empty"),
        ("truncated", "cifar10", "not a whole number of 3073-byte cifar10"),
        ("cifar100_as_cifar10", "cifar10", "did you mean --dataset=cifar100"),
        ("cifar10_as_cifar100", "cifar100", "3074-byte cifar100"),
        ("bad_label", "cifar10", "record 3 has label 200"),
    ],
)
def test_bad_input_names_the_file(tmp_path, case, dataset, expected):
    path = str(tmp_path / "batch.bin")
    if case == "no_match":
        path = str(tmp_path / "missing_*.bin")
    elif case == "empty":
        _write(path, b"")
    elif case == "truncated":
        write_cifar_records(path, "cifar10", 4)
        _write(path, _read(path)[:-100])
    elif case == "cifar100_as_cifar10":
        write_cifar_records(path, "cifar100", 3073)  # 3073*3074 bytes.
    elif case == "cifar10_as_cifar100":
        write_cifar_records(path, "cifar10", 5)
    elif case == "bad_label":
        write_cifar_records(path, "cifar10", 5)
        raw = bytearray(_read(path))
        raw[3 * 3073] = 200
        _write(path, bytes(raw))
    before = os.listdir(tmp_path)
    with pytest.raises(DataError) as error:
        build_dataset(dataset, path, True, 4)
    message = str(error.value)
    assert path in message and expected in message
    assert os.listdir(tmp_path) == before


def test_image_size_option_resizes(tmp_path):
    write_cifar_records(tmp_path / "t.bin", "cifar10", 4)
    images, _ = next(
        iter(
            build_dataset(
                "cifar10", str(tmp_path / "t.bin"), False, 4, image_size=64
            )
        )
    )
    assert images.shape == (4, 64, 64, 3)
    assert tf.reduce_all(tf.math.is_finite(images))

"""The CIFAR binary reader against the raw bytes it reads."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests.data_files import write_cifar_records
from tf_resnet.data import DATASETS, InputOptions, open_split
from tf_resnet.errors import DataError, UserInputError


def standardized(images):
    """numpy twin of tf.image.per_image_standardization."""
    x = images.astype(np.float64)
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    std = x.std(axis=(1, 2, 3), keepdims=True)
    return (x - mean) / np.maximum(std, 1.0 / np.sqrt(x[0].size))


def build(dataset, pattern, training, batch_size, **options):
    split = open_split(dataset, pattern, training=training)
    return split.dataset(batch_size, InputOptions(**options))


def collect(dataset):
    images, labels = zip(
        *[(x.numpy(), y.numpy()) for x, y in dataset], strict=True
    )
    return np.concatenate(images), np.concatenate(labels)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_eval_reader_matches_raw_bytes_in_file_order(tmp_path, dataset):
    first = write_cifar_records(tmp_path / "b_1.bin", dataset, 37, seed=1)
    second = write_cifar_records(tmp_path / "b_2.bin", dataset, 20, seed=2)
    split = open_split(dataset, str(tmp_path / "b_*.bin"), training=False)
    images, labels = collect(split.dataset(16))
    expected_images = np.concatenate([first[0], second[0]])
    expected_labels = np.concatenate([first[1], second[1]])
    np.testing.assert_array_equal(labels, expected_labels)  # Fine labels.
    np.testing.assert_allclose(images, standardized(expected_images), atol=1e-4)
    assert images.dtype == np.float32 and labels.dtype == np.int32
    assert split.num_examples == 57
    assert split.num_classes == DATASETS[dataset].num_classes
    assert (split.source, split.image_size) == ("binary", 32)


def test_training_stream_is_deterministic_and_resumable(tmp_path):
    write_cifar_records(tmp_path / "t.bin", "cifar10", 50)
    pattern = str(tmp_path / "t.bin")

    def batches(start_step, count, seed=7):
        ds = build(
            "cifar10",
            pattern,
            True,
            8,
            seed=seed,
            start_step=start_step,
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
    ds = build(
        "cifar10", str(tmp_path / "t.bin"), True, 16, shuffle=False, pad=0
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
            build(
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
        build(dataset, path, True, 4)
    message = str(error.value)
    assert path in message and expected in message
    assert os.listdir(tmp_path) == before


def test_image_size_option_resizes(tmp_path):
    write_cifar_records(tmp_path / "t.bin", "cifar10", 4)
    images, _ = next(
        iter(build("cifar10", str(tmp_path / "t.bin"), False, 4, image_size=64))
    )
    assert images.shape == (4, 64, 64, 3)
    assert tf.reduce_all(tf.math.is_finite(images))


def test_dataset_normalization_uses_the_published_channel_statistics(
    tmp_path,
):
    images, _ = write_cifar_records(tmp_path / "t.bin", "cifar100", 6)
    facts = DATASETS["cifar100"]
    mean = np.array(facts.mean) * 255.0
    std = np.array(facts.std) * 255.0
    split = open_split("cifar100", str(tmp_path / "t.bin"), training=False)
    got, _ = collect(split.dataset(4, InputOptions(normalization="dataset")))
    np.testing.assert_allclose(got, (images - mean) / std, atol=1e-4)
    # Per image it is not: one image's output does not depend on the others.
    per_image, _ = collect(split.dataset(4))
    assert not np.allclose(got, per_image, atol=1e-2)


def test_an_image_of_the_dataset_mean_normalizes_to_zero(tmp_path):
    facts = DATASETS["cifar10"]
    pixel = np.round(np.array(facts.mean) * 255.0)
    record = np.concatenate(
        [[3], np.repeat(pixel, 32 * 32)]  # R plane, G plane, B plane.
    ).astype(np.uint8)
    path = tmp_path / "mean.bin"
    path.write_bytes(record.tobytes())
    split = open_split("cifar10", str(path), training=False)
    images, labels = collect(
        split.dataset(1, InputOptions(normalization="dataset"))
    )
    assert labels.tolist() == [3]
    rounding = np.abs(pixel - np.array(facts.mean) * 255.0)
    expected = rounding / (np.array(facts.std) * 255.0)
    np.testing.assert_allclose(
        np.abs(images[0]).max(axis=(0, 1)), expected, rtol=1e-4
    )
    assert np.abs(images).max() < 0.01


def test_unknown_normalization_is_a_user_input_error():
    with pytest.raises(UserInputError, match="normalization='imagenet'"):
        InputOptions(normalization="imagenet")


@pytest.mark.parametrize(
    "dataset, names_file",
    [("cifar10", "batches.meta.txt"), ("cifar100", "fine_label_names.txt")],
)
def test_class_names_come_from_the_text_file_next_to_the_data(
    tmp_path, dataset, names_file
):
    write_cifar_records(tmp_path / "test_batch.bin", dataset, 3)
    pattern = str(tmp_path / "test_batch.bin")
    assert open_split(dataset, pattern, training=False).class_names is None
    count = DATASETS[dataset].num_classes
    names = [f"class {i}" for i in range(count)]
    # The official files end with blank lines.
    (tmp_path / names_file).write_text("\n".join(names) + "\n\n")
    split = open_split(dataset, pattern, training=False)
    assert split.class_names == names
    (tmp_path / names_file).write_text("\n".join(names[:-1]))
    with pytest.raises(DataError, match=f"lists {count - 1} class names"):
        open_split(dataset, pattern, training=False)


def test_split_is_listed_and_checked_once_when_opened(tmp_path):
    _, labels = write_cifar_records(tmp_path / "b_1.bin", "cifar10", 5)
    split = open_split("cifar10", str(tmp_path / "b_*.bin"), training=False)
    # A file that appears later is not listed again, and a file broken
    # after opening is not checked again: the pipelines read what was
    # opened.
    write_cifar_records(tmp_path / "b_2.bin", "cifar10", 7)
    with open(tmp_path / "b_1.bin", "r+b") as stream:
        stream.write(bytes([200]))  # A label byte out of range.
    for _ in range(2):
        got_images, got_labels = collect(split.dataset(4))
        assert len(got_labels) == split.num_examples == 5
        assert got_labels.tolist() == [200, *labels[1:]]
    with pytest.raises(DataError, match="label 200"):
        open_split("cifar10", str(tmp_path / "b_*.bin"), training=False)

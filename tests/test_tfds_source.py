"""The tensorflow-datasets source, on CIFAR prepared offline in tmp_path.

The fixture runs TFDS's own CIFAR builder on binary files written here
(its download manager replaced by one that hands over the local folder), so
the reader is tested on genuinely prepared TFDS data; `mock_data` checks the
path through `tfds` mocking as well.
"""

import os
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
import tensorflow_datasets.testing  # noqa: F401  (tfds.testing.mock_data)

from tests.data_files import write_cifar_records
from tests.helpers import run_main
from tf_resnet import data
from tf_resnet.errors import DataError

LAYOUT = {
    # dataset: (folder in the archive, {file: records}, label files)
    "cifar10": (
        "cifar-10-batches-bin",
        {
            "data_batch_1.bin": 12,
            **{f"data_batch_{i}.bin": 2 for i in range(2, 6)},
            "test_batch.bin": 7,
        },
        {"batches.meta.txt": 10},
    ),
    "cifar100": (
        "cifar-100-binary",
        {"train.bin": 20, "test.bin": 7},
        {"coarse_label_names.txt": 20, "fine_label_names.txt": 100},
    ),
}


def prepare_offline(dataset, source_root, data_dir):
    """Writes the binaries and runs `download_and_prepare` without network.

    Returns `{"train"/"test": (images, labels)}` in TFDS's `id` order.
    """
    folder, files, label_files = LAYOUT[dataset]
    os.makedirs(os.path.join(source_root, folder))
    raw = {"train": [], "test": []}
    for seed, (name, count) in enumerate(files.items()):
        path = os.path.join(source_root, folder, name)
        split = "test" if name.startswith("test") else "train"
        raw[split].append(write_cifar_records(path, dataset, count, seed=seed))
    for name, count in label_files.items():
        with open(os.path.join(source_root, folder, name), "w") as stream:
            stream.write("\n".join(f"class_{i}" for i in range(count)))
    builder = tfds.builder(dataset, data_dir=data_dir)
    downloads = mock.MagicMock()
    downloads.download_and_extract.return_value = source_root
    with mock.patch.object(
        type(builder), "_make_download_manager", return_value=downloads
    ):
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(
                compute_stats=tfds.download.ComputeStatsMode.SKIP
            )
        )
    return {
        split: tuple(
            np.concatenate(parts) for parts in zip(*arrays, strict=True)
        )
        for split, arrays in raw.items()
    }


@pytest.fixture(scope="module", params=["cifar10", "cifar100"])
def prepared(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    data_dir = str(root / "tfds")
    raw = prepare_offline(request.param, str(root / "source"), data_dir)
    return request.param, data_dir, raw


def _all_batches(dataset):
    batches = list(dataset)
    images = np.concatenate([images.numpy() for images, _ in batches])
    labels = np.concatenate([labels.numpy() for _, labels in batches])
    return images, labels


def _stored_ids(dataset, data_dir, split):
    """Record indices in stored order, read by TFDS itself."""
    examples = tfds.builder(dataset, data_dir=data_dir).as_dataset(
        split=split,
        shuffle_files=False,
        read_config=tfds.ReadConfig(interleave_cycle_length=1),
    )
    return [int(ex["id"].numpy().decode().split("_")[1]) for ex in examples]


def test_eval_split_has_the_raw_pixels_and_fine_labels(prepared):
    dataset, data_dir, raw = prepared
    images, labels = _all_batches(
        data.open_split(
            dataset, data_dir, training=False, source="tfds"
        ).dataset(3)
    )
    order = _stored_ids(dataset, data_dir, "test")
    raw_images, raw_labels = raw["test"]
    assert sorted(order) == list(range(7))
    # For CIFAR-100 the coarse label differs from the fine one (helpers).
    np.testing.assert_array_equal(labels, raw_labels[order])
    np.testing.assert_allclose(
        images,
        tf.image.per_image_standardization(raw_images[order]),
        atol=1e-5,
    )


def test_train_split_counts_and_resumes(prepared):
    dataset, data_dir, raw = prepared
    split = data.open_split(dataset, data_dir, training=True, source="tfds")
    assert split.num_examples == len(raw["train"][1])
    names = tfds.builder(dataset, data_dir=data_dir).info.features["label"]
    assert split.class_names == names.names
    assert len(split.class_names) == data.DATASETS[dataset].num_classes

    def batches(start_step, count):
        pipeline = split.dataset(
            4, data.InputOptions(seed=2, start_step=start_step)
        )
        return [(i.numpy(), lbl.numpy()) for i, lbl in pipeline.take(count)]

    fresh, resumed = batches(0, 3), batches(2, 1)
    assert fresh[0][0].shape == (4, 32, 32, 3)
    np.testing.assert_array_equal(resumed[0][0], fresh[2][0])
    np.testing.assert_array_equal(resumed[0][1], fresh[2][1])


def test_every_training_epoch_is_a_permutation_of_the_split(prepared):
    dataset, data_dir, raw = prepared
    split = data.open_split(dataset, data_dir, training=True, source="tfds")
    count = split.num_examples
    facts = data.DATASETS[dataset]
    mean, std = 255.0 * np.array(facts.mean), 255.0 * np.array(facts.std)
    raw_images, raw_labels = raw["train"]
    index_of = {image.tobytes(): i for i, image in enumerate(raw_images)}
    index_of.update(
        {image[:, ::-1].tobytes(): i for i, image in enumerate(raw_images)}
    )
    # One batch an epoch; no padding, so a crop is the image or its flip.
    pipeline = split.dataset(
        count, data.InputOptions(seed=1, pad=0, normalization="dataset")
    )
    epochs = []
    for images, labels in pipeline.take(2):
        pixels = np.rint(images.numpy() * std + mean).astype(np.uint8)
        found = [index_of[image.tobytes()] for image in pixels]
        assert sorted(found) == list(range(count))
        np.testing.assert_array_equal(labels, raw_labels[found])
        epochs.append(found)
    assert epochs[0] != epochs[1]


def test_not_prepared_is_a_data_error_and_never_downloads(tmp_path):
    empty = str(tmp_path / "empty")
    with mock.patch.object(
        tfds.core.DatasetBuilder,
        "download_and_prepare",
        side_effect=AssertionError("the reader tried to download"),
    ) as download:
        with pytest.raises(DataError, match="not prepared") as error:
            data.open_split("cifar10", empty, training=True, source="tfds")
        assert empty in str(error.value) and "tfds build" in str(error.value)
        with pytest.raises(DataError, match="not prepared"):
            data.open_split("cifar100", empty, training=False, source="tfds")
    download.assert_not_called()


def test_reader_under_tfds_mock_data_matches_tfds(tmp_path):
    with tfds.testing.mock_data(num_examples=6, data_dir=str(tmp_path)):
        images, labels = _all_batches(
            data.open_split(
                "cifar100", str(tmp_path), training=False, source="tfds"
            ).dataset(4)
        )
        expected = list(
            tfds.load("cifar100", split="test", data_dir=str(tmp_path))
        )
    np.testing.assert_array_equal(labels, [ex["label"] for ex in expected])
    np.testing.assert_allclose(
        images,
        tf.image.per_image_standardization(
            np.stack([ex["image"] for ex in expected])
        ),
        atol=1e-5,
    )


@pytest.mark.parametrize("prepared", ["cifar10"], indirect=True)
def test_command_line_reads_tfds_data_dir(prepared):
    dataset, data_dir, raw = prepared
    proc = run_main(
        [
            f"--dataset={dataset}",
            "--data_source=tfds",
            f"--tfds_data_dir={data_dir}",
            f"--log_root={data_dir}_run",
            "--train_steps=1",
            "--batch_size=4",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"over {len(raw['test'][1])} examples" in proc.stderr

"""Every training epoch is a permutation of the whole split, at real sizes.

Each split here is larger than any shuffle buffer a pipeline would keep
(12,000 examples) and stored class by class, as an image folder lists its
files: a pipeline that only shuffles a window of its input shows a few
classes per batch. Record `i` of the generated CIFAR files carries its own
index in its pixels (red and green: the index's two bytes; blue: the
label), so the batches say exactly which examples they hold.
"""

import json
import math
import os

import numpy as np
import pytest

from tests.data_files import write_py2_pickle
from tests.helpers import load_data_script
from tf_resnet.config import layers as config_lib
from tf_resnet.config import settings
from tf_resnet.data import DATASETS, InputOptions, open_split, pipeline

CLASSES, PER_CLASS = 100, 120  # CIFAR-100 files sorted by label.
EXAMPLES = CLASSES * PER_CLASS
BATCH = 120  # An epoch is 100 batches.
# Identity of a pixel after the pipeline: a 32x32 crop of an unpadded
# image, flips (the images are constant) and the dataset's mean/std.
EXACT = {"pad": 0, "normalization": "dataset"}


def uniform_distinct_bound(classes, draws, sigmas=6):
    """Distinct classes that `draws` uniform draws reach but for ~1e-9.

    The mean and variance of the number of distinct values among `draws`
    independent uniform draws from `classes` values, minus `sigmas`
    standard deviations (a sample without replacement spreads more).
    """
    miss = (1 - 1 / classes) ** draws
    mean = classes * (1 - miss)
    variance = (
        classes * miss
        + classes * (classes - 1) * (1 - 2 / classes) ** draws
        - classes**2 * miss**2
    )
    return mean - sigmas * math.sqrt(variance)


def sorted_images():
    """uint8 `[N, 32, 32, 3]` images naming their index, and the labels."""
    index = np.arange(EXAMPLES)
    labels = index // PER_CLASS
    images = np.empty((EXAMPLES, 32, 32, 3), np.uint8)
    images[..., 0] = (index >> 8)[:, None, None]
    images[..., 1] = (index & 255)[:, None, None]
    images[..., 2] = labels[:, None, None]
    return images, labels


def write_sorted_binary(path):
    images, labels = sorted_images()
    coarse = (labels % 20).astype(np.uint8)
    planes = images.transpose(0, 3, 1, 2).reshape(EXAMPLES, -1)
    header = np.stack([coarse, labels.astype(np.uint8)], axis=1)
    with open(path, "wb") as stream:
        stream.write(np.concatenate([header, planes], axis=1).tobytes())
    return str(path)


def write_sorted_pickle(path):
    images, labels = sorted_images()
    write_py2_pickle(
        path,
        {
            b"data": images.transpose(0, 3, 1, 2).reshape(EXAMPLES, 3072),
            b"fine_labels": [int(label) for label in labels],
            b"coarse_labels": [int(label) % 20 for label in labels],
        },
    )
    return str(path)


@pytest.fixture(scope="module", params=["binary", "pickle"])
def sorted_split(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    writer = {"binary": write_sorted_binary, "pickle": write_sorted_pickle}
    path = writer[request.param](folder / "train")
    split = open_split("cifar100", path, training=True)
    assert split.source == request.param
    return split


def read_indices(split, batch_size, count, **options):
    """Indices `[count, batch]` of the examples in the first batches."""
    facts = DATASETS["cifar100"]
    mean = 255.0 * np.array(facts.mean)
    std = 255.0 * np.array(facts.std)
    dataset = split.dataset(batch_size, InputOptions(**EXACT, **options))
    batches = []
    for images, labels in dataset.take(count):
        pixels = np.rint(images.numpy()[:, 0, 0] * std + mean).astype(int)
        np.testing.assert_array_equal(pixels[:, 2], labels.numpy())
        batches.append(pixels[:, 0] * 256 + pixels[:, 1])
    return np.array(batches)


def test_every_epoch_is_a_new_permutation_of_the_whole_split(sorted_split):
    epochs = read_indices(sorted_split, BATCH, 2 * EXAMPLES // BATCH, seed=4)
    first, second = epochs.reshape(2, EXAMPLES)
    np.testing.assert_array_equal(np.sort(first), np.arange(EXAMPLES))
    np.testing.assert_array_equal(np.sort(second), np.arange(EXAMPLES))
    assert not np.array_equal(first, second)
    # A batch holds the classes a uniform draw would, not a window of them.
    bound = uniform_distinct_bound(CLASSES, BATCH)
    for batch in (epochs[0], epochs[50], epochs[100]):
        assert len(set(batch // PER_CLASS)) >= bound, batch // PER_CLASS
    assert bound > 50  # Against the 1-2 classes of a sorted file's window.


def test_the_order_is_the_seed_s_and_resumes_mid_epoch(sorted_split):
    fresh = read_indices(sorted_split, BATCH, 103, seed=4)
    resumed = read_indices(sorted_split, BATCH, 5, seed=4, start_step=98)
    np.testing.assert_array_equal(resumed, fresh[98:])
    other = read_indices(sorted_split, BATCH, 1, seed=5)
    assert not np.array_equal(other[0], fresh[0])


@pytest.mark.parametrize("shards", [2, 3])
def test_shards_split_each_global_batch_and_cover_the_split_once(
    sorted_split, shards
):
    """What Horovod ranks and tf.distribute workers read, side by side."""
    per_shard = BATCH // shards
    steps = EXAMPLES // BATCH + 3  # Past the end of the first epoch.
    one = read_indices(sorted_split, BATCH, steps, seed=4)
    parts = [
        read_indices(
            sorted_split,
            per_shard,
            steps,
            seed=4,
            num_shards=shards,
            shard_index=index,
        )
        for index in range(shards)
    ]
    together = np.concatenate(parts, axis=1)
    np.testing.assert_array_equal(np.sort(together), np.sort(one))
    epoch = together[: EXAMPLES // BATCH].ravel()
    np.testing.assert_array_equal(np.sort(epoch), np.arange(EXAMPLES))
    resumed = read_indices(
        sorted_split,
        per_shard,
        2,
        seed=4,
        num_shards=shards,
        shard_index=shards - 1,
        start_step=steps - 2,
    )
    np.testing.assert_array_equal(resumed, parts[-1][-2:])


def test_a_resumed_order_starts_at_its_position_inside_an_epoch():
    resumed = pipeline.training_order(10, 3, InputOptions(seed=1, start_step=7))
    fresh = pipeline.training_order(10, 3, InputOptions(seed=1))
    assert list(resumed.take(9).as_numpy_iterator()) == list(
        fresh.skip(21).take(9).as_numpy_iterator()
    )
    # Epochs follow each other without end or gap.
    assert len(list(resumed.take(35).as_numpy_iterator())) == 35


@pytest.fixture(scope="module")
def folder_200(tmp_path_factory):
    """A Tiny-ImageNet layout of 200 classes x 60 JPEGs, written in order."""
    root = str(tmp_path_factory.mktemp("tiny") / "tiny-imagenet-200")
    script = load_data_script("make_synthetic_tinyimagenet")
    script.make(
        root,
        classes=200,
        train_per_class=60,
        val_images=20,
        seed=0,
        jpegs_from="",
    )
    return root


def test_image_folder_batches_hold_the_classes_of_a_uniform_draw(folder_200):
    split = open_split("tinyimagenet", folder_200, training=True)
    assert (split.num_examples, split.num_classes) == (12_000, 200)
    assert split.labels == sorted(split.labels)  # Listed class by class.
    bound = uniform_distinct_bound(200, 128)
    assert bound > 70  # A 10,000-element buffer on such a folder: 21.
    for seed in (0, 1):
        _, labels = next(iter(split.dataset(128, InputOptions(seed=seed))))
        assert len(set(labels.numpy())) >= bound
    # Every class within the first quarter epoch; each example once an
    # epoch (the order, without decoding 12,000 JPEGs).
    order = pipeline.training_order(split.num_examples, 128, InputOptions())
    epoch = np.array(list(order.take(split.num_examples).as_numpy_iterator()))
    labels = np.array(split.labels)
    assert len(set(labels[epoch[: split.num_examples // 4]])) == 200
    np.testing.assert_array_equal(np.sort(epoch), np.arange(12_000))


def test_a_run_saved_with_a_shuffle_buffer_still_resumes(tmp_path):
    config = settings.make_config(log_root=str(tmp_path))
    document = {"config": json.loads(config.to_json()), "plan": {}}
    document["config"]["data"]["shuffle_buffer"] = 10_000
    with open(os.path.join(tmp_path, config_lib.CONFIG_FILE), "w") as stream:
        json.dump(document, stream)
    saved = config_lib.load_saved(str(tmp_path))
    assert "shuffle_buffer" not in saved
    assert saved["shuffle"] is True

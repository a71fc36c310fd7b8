"""The Tiny-ImageNet folder reader, on small folders written in tmp_path."""

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import all_batches

from tf_resnet import data, train_loop
from tf_resnet.config import make_config
from tf_resnet.data import tinyimagenet
from tf_resnet.distribute import tf_strategy
from tf_resnet.errors import DataError

# Created in this (unsorted) order: labels must follow the sorted names.
WNIDS = ("n03000000", "n01000000", "n02000000")


def _write_jpeg(path, rng, grayscale=False, size=64):
    channels = 1 if grayscale else 3
    pixels = rng.integers(0, 256, (size, size, channels), dtype=np.uint8)
    encoded = tf.io.encode_jpeg(pixels, quality=95).numpy()
    with open(path, "wb") as stream:
        stream.write(encoded)
    # The exact pixels a JPEG reader must return (JPEG is lossy).
    return tf.io.decode_jpeg(encoded, channels=3).numpy()


def write_tiny_imagenet(root, train_per_class=4, val_per_class=2, seed=0):
    """Official layout; returns {"train"/"val": [(path, label, pixels)]}."""
    rng = np.random.default_rng(seed)
    label_of = {wnid: i for i, wnid in enumerate(sorted(WNIDS))}
    written = {"train": [], "val": []}
    for wnid in WNIDS:
        folder = os.path.join(root, "train", wnid, "images")
        os.makedirs(folder)
        with open(os.path.join(root, "train", wnid, f"{wnid}_boxes.txt"), "w"):
            pass
        for i in range(train_per_class):
            path = os.path.join(folder, f"{wnid}_{i}.JPEG")
            pixels = _write_jpeg(path, rng, grayscale=i == 1)
            written["train"].append((path, label_of[wnid], pixels))
    os.makedirs(os.path.join(root, "val", "images"))
    lines = []
    for k in range(val_per_class * len(WNIDS)):
        wnid = WNIDS[(k * 2) % len(WNIDS)]
        path = os.path.join(root, "val", "images", f"val_{k}.JPEG")
        pixels = _write_jpeg(path, rng, grayscale=k == 0)
        written["val"].append((path, label_of[wnid], pixels))
        lines.append(f"val_{k}.JPEG\t{wnid}\t0\t1\t60\t62\n")
    # Not in file-name order: the reader must keep the annotation order.
    order = [3, 0, 5, 1, 4, 2][: len(lines)]
    with open(os.path.join(root, "val", "val_annotations.txt"), "w") as out:
        out.writelines(lines[i] for i in order)
    written["val"] = [written["val"][i] for i in order]
    written["train"].sort(key=lambda item: (item[1], item[0]))
    return written


@pytest.fixture()
def tiny(tmp_path):
    root = str(tmp_path / "tiny-imagenet-200")
    return root, write_tiny_imagenet(root)


def _snapshot(root):
    return sorted(
        (path, os.path.getmtime(os.path.join(path, name)), name)
        for path, _, names in os.walk(root)
        for name in names
    )


def test_classes_are_sorted_wnids_like_image_folder(tiny):
    root, written = tiny
    paths, labels = tinyimagenet.list_train(root)
    assert tinyimagenet.class_names(root) == sorted(WNIDS)
    assert paths == [path for path, _, _ in written["train"]]
    assert labels == [label for _, label, _ in written["train"]]
    info = data.dataset_info("tinyimagenet", root, "folder")
    assert (info.num_classes, info.image_size) == (3, 64)
    assert data.num_examples("tinyimagenet", root, "folder") == 12


def test_eval_reads_val_annotations_in_order_with_exact_pixels(tiny):
    root, written = tiny
    before = _snapshot(root)
    dataset = data.build_dataset(
        "tinyimagenet", root, training=False, batch_size=4, source="folder"
    )
    images, labels = all_batches(dataset)
    expected = np.stack([pixels for _, _, pixels in written["val"]])
    np.testing.assert_array_equal(
        labels, [label for _, label, _ in written["val"]]
    )
    np.testing.assert_allclose(
        images, tf.image.per_image_standardization(expected), atol=1e-5
    )
    # A grayscale JPEG came back as three equal channels.
    gray = [i for i, (p, _, _) in enumerate(written["val"]) if "val_0." in p]
    assert images.shape[1:] == (64, 64, 3)
    np.testing.assert_array_equal(images[gray, ..., 0], images[gray, ..., 2])
    assert _snapshot(root) == before  # Nothing moved or rewritten.


def test_eval_shards_cover_val_once(tiny):
    root, _ = tiny
    shards = [
        all_batches(
            data.build_dataset(
                "tinyimagenet",
                root,
                False,
                2,
                source="folder",
                num_shards=2,
                shard_index=index,
            )
        )[1]
        for index in range(2)
    ]
    assert sorted(np.concatenate(shards)) == [0, 0, 1, 1, 2, 2]


def test_training_batches_resume_like_an_uninterrupted_run(tiny):
    root, _ = tiny

    def batches(start_step, count):
        dataset = data.build_dataset(
            "tinyimagenet",
            root,
            True,
            4,
            source="folder",
            seed=3,
            start_step=start_step,
            shuffle_buffer=100,
        )
        return [(i.numpy(), lbl.numpy()) for i, lbl in dataset.take(count)]

    fresh = batches(0, 3)
    resumed = batches(2, 1)
    assert fresh[0][0].shape == (4, 64, 64, 3)
    assert fresh[0][1].dtype == np.int32
    np.testing.assert_array_equal(resumed[0][0], fresh[2][0])
    np.testing.assert_array_equal(resumed[0][1], fresh[2][1])
    assert set(np.concatenate([lbl for _, lbl in fresh])) <= {0, 1, 2}


def _remove(path):
    os.remove(path)


def _write(content):
    def write(path):
        with open(path, "wb") as stream:
            stream.write(content)

    return write


def _png(path):
    pixels = np.zeros((64, 64, 3), np.uint8)
    _write(tf.io.encode_png(pixels).numpy())(path)


def _truncate(path):
    with open(path, "rb") as stream:
        content = stream.read()
    _write(content[: len(content) // 2])(path)


def _append_annotation(wnid):
    def append(path):
        with open(path, "a") as stream:
            stream.write(f"val_0.JPEG\t{wnid}\t0\t0\t1\t1\n")

    return append


def _empty_class(path):
    for name in os.listdir(path):
        os.remove(os.path.join(path, name))


TRAIN_IMAGE = "train/n02000000/images/n02000000_2.JPEG"
ERROR_CASES = {
    "missing train/": (
        "train",
        lambda p: os.rename(p, p + "_gone"),
        "train: missing",
    ),
    "missing annotations": (
        "val/val_annotations.txt",
        _remove,
        "val_annotations.txt: missing",
    ),
    "unknown wnid": (
        "val/val_annotations.txt",
        _append_annotation("n09999999"),
        "n09999999",
    ),
    "missing val image": ("val/images/val_4.JPEG", _remove, "val_4.JPEG"),
    "empty class folder": (
        "train/n01000000/images",
        _empty_class,
        "n01000000/images",
    ),
    "missing images/ folder": (
        "train/n01000000/images",
        lambda p: os.rename(p, p + "_gone"),
        "n01000000/images",
    ),
    "zero-byte JPEG": (TRAIN_IMAGE, _write(b""), "empty"),
    "garbage": (TRAIN_IMAGE, _write(b"<html>not found</html>"), "not a JPEG"),
    "PNG renamed .JPEG": (TRAIN_IMAGE, _png, "89 50"),
    "truncated JPEG": (TRAIN_IMAGE, _truncate, "truncated"),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_bad_data_is_a_data_error_naming_the_path(tiny, case):
    root, _ = tiny
    relative, damage, message = ERROR_CASES[case]
    damage(os.path.join(root, relative))
    with pytest.raises(DataError, match=message) as error:
        for training in (True, False):
            data.build_dataset(
                "tinyimagenet", root, training, 2, source="folder"
            )
    assert root in str(error.value)


def test_missing_root_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        data.num_examples("tinyimagenet", str(tmp_path / "nope"), "folder")


def test_image_of_wrong_size_fails_naming_the_file(tiny):
    root, written = tiny
    path = written["val"][2][0]
    _write_jpeg(path, np.random.default_rng(1), size=32)
    dataset = data.build_dataset(
        "tinyimagenet", root, False, 2, source="folder"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="val_"):
        all_batches(dataset)


def test_training_loop_on_tiny_imagenet_folder(tmp_path):
    root = str(tmp_path / "tiny")
    write_tiny_imagenet(root, train_per_class=8, val_per_class=2)
    config = make_config(
        dataset="tinyimagenet",
        data_source="folder",
        train_data_path=root,
        eval_data_path=root,
        log_root=str(tmp_path / "log"),
        model="resnet20",
        batch_size=8,
        train_steps=2,
        log_every_steps=1,
        shuffle_buffer=100,
    )
    result = train_loop.train(
        config, tf_strategy.default_mode(config.optim.batch_size)
    )
    assert result["step"] == 2
    assert result["examples"] == 6  # The whole validation split.
    assert 0.0 <= result["precision"] <= 1.0
    shapes = [
        shape for _, shape in tf.train.list_variables(config.run.log_root)
    ]
    assert [64, 3] in shapes  # Classifier sized from the 3 class folders.

"""The Tiny-ImageNet folder reader, on small folders written in tmp_path."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests.data_files import WNIDS, write_jpeg, write_tiny_imagenet
from tests.helpers import all_batches, run_main
from tf_resnet import data, summaries, train_loop
from tf_resnet.config.settings import make_config
from tf_resnet.data import tinyimagenet
from tf_resnet.distribute import tf_strategy
from tf_resnet.errors import DataError, UserInputError


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
    split = data.open_split("tinyimagenet", root, training=True)
    assert tinyimagenet.class_wnids(root) == sorted(WNIDS)
    assert split.paths == [path for path, _, _ in written["train"]]
    assert split.labels == [label for _, label, _ in written["train"]]
    assert (split.num_classes, split.image_size) == (3, 64)
    assert (split.num_examples, split.source) == (12, "folder")


def test_eval_reads_val_annotations_in_order_with_exact_pixels(tiny):
    root, written = tiny
    before = _snapshot(root)
    split = data.open_split("tinyimagenet", root, training=False)
    images, labels = all_batches(split.dataset(4))
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
            data.open_split("tinyimagenet", root, training=False).dataset(
                2, data.InputOptions(num_shards=2, shard_index=index)
            )
        )[1]
        for index in range(2)
    ]
    assert sorted(np.concatenate(shards)) == [0, 0, 1, 1, 2, 2]


def test_training_batches_resume_like_an_uninterrupted_run(tiny):
    root, _ = tiny

    def batches(start_step, count):
        dataset = data.open_split("tinyimagenet", root, training=True).dataset(
            4,
            data.InputOptions(seed=3, start_step=start_step),
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
            data.open_split("tinyimagenet", root, training=training)
    assert root in str(error.value)


def test_missing_root_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        data.open_split("tinyimagenet", str(tmp_path / "nope"), training=True)


def test_image_of_wrong_size_fails_naming_the_file(tiny):
    root, written = tiny
    path = written["val"][2][0]
    write_jpeg(path, np.random.default_rng(1), size=32)
    dataset = data.open_split("tinyimagenet", root, training=False).dataset(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="val_"):
        all_batches(dataset)


def test_training_loop_on_tiny_imagenet_folder(tmp_path, monkeypatch):
    root = str(tmp_path / "tiny")
    written = write_tiny_imagenet(root, train_per_class=8, val_per_class=2)
    checked = []

    def check_jpeg(path):  # The real check, counted.
        checked.append(path)
        real_check_jpeg(path)

    real_check_jpeg = tinyimagenet.check_jpeg
    monkeypatch.setattr(tinyimagenet, "check_jpeg", check_jpeg)
    config = make_config(
        dataset="tinyimagenet",  # The source is inferred: folder.
        train_data_path=root,
        eval_data_path=root,
        log_root=str(tmp_path / "log"),
        model="resnet20",
        batch_size=8,
        train_steps=2,
        log_every_steps=1,
    )
    result = train_loop.train(
        config, tf_strategy.default_distributor(config.optim)
    )
    assert result["step"] == 2
    assert result["examples"] == 6  # The whole validation split.
    assert 0.0 <= result["precision"] <= 1.0
    shapes = [
        shape for _, shape in tf.train.list_variables(config.run.log_root)
    ]
    assert [64, 3] in shapes  # Classifier sized from the 3 class folders.
    # The learning curve names the split as TinyImageNet does: val.
    history = summaries.EvalHistory(config.run.log_root)
    (row,) = history.rows.values()
    assert row["split"] == "val" and row["train_loss"], row
    (axes, _) = history.figure().axes
    assert [x.get_label() for x in axes.lines] == ["val", "train"]
    # Each image of both splits was checked exactly once in this process.
    all_paths = [path for items in written.values() for path, _, _ in items]
    assert sorted(checked) == sorted(all_paths)


def test_command_line_needs_no_data_source(tmp_path):
    root = str(tmp_path / "tiny")
    write_tiny_imagenet(root, train_per_class=2, val_per_class=2)
    proc = run_main(
        [
            "--dataset=tinyimagenet",
            f"--train_data_path={root}",
            f"--eval_data_path={root}",
            f"--log_root={tmp_path / 'log'}",
            "--model=resnet20",
            "--train_steps=1",
            "--batch_size=2",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "on tinyimagenet: 6 examples" in proc.stderr


def test_tinyimagenet_has_only_the_folder_source(tiny):
    root, _ = tiny
    with pytest.raises(UserInputError, match="its sources: folder"):
        data.open_split("tinyimagenet", root, training=True, source="binary")


def test_class_names_come_from_words_txt(tiny):
    root, _ = tiny
    assert (
        data.open_split("tinyimagenet", root, training=True).class_names is None
    )
    words = {
        "n00001740": "entity",
        "n01000000": "goldfish, Carassius auratus",
        "n02000000": "tabby, tabby cat",
        # n03000000 is missing: it keeps its wnid as its name.
    }
    with open(os.path.join(root, "words.txt"), "w", encoding="utf-8") as out:
        out.writelines(f"{wnid}\t{text}\n" for wnid, text in words.items())
    for training in (True, False):
        split = data.open_split("tinyimagenet", root, training=training)
        assert split.class_names == [
            "goldfish, Carassius auratus",
            "tabby, tabby cat",
            "n03000000",
        ]

"""mixup, cutmix and cutout: label weights, determinism, identity cases."""

import numpy as np
import pytest
import tensorflow as tf

from tf_resnet.data import augment

SEED = tf.constant([3, 7], tf.int64)


def unique_batch(size=8, height=12, width=10):
    """Images whose every value is distinct, and one class per example."""
    values = np.random.default_rng(0).permutation(size * height * width * 3)
    images = tf.constant(
        1.0 + values.reshape(size, height, width, 3), tf.float32
    )
    return images, tf.eye(size)  # Example i has class i.


def partners_and_weight(labels):
    """Each row's partner class and its own class' weight."""
    labels = labels.numpy()
    own = np.diag(labels).copy()
    off = labels - np.diag(own)
    partners = np.where(off.max(axis=1) > 0, off.argmax(axis=1), np.arange(8))
    return partners, own


def test_mixup_blends_images_and_labels_with_one_coefficient():
    images, labels = unique_batch()
    mixed, targets = augment.mixup(images, labels, SEED, alpha=1.0)
    np.testing.assert_allclose(targets.numpy().sum(axis=1), 1.0, rtol=1e-6)
    partners, own = partners_and_weight(targets)
    moved = partners != np.arange(8)
    assert moved.sum() >= 2
    lam = own[moved][0]
    assert 0.0 < lam < 1.0
    np.testing.assert_allclose(own[moved], lam, rtol=1e-6)
    expected = lam * images.numpy() + (1 - lam) * images.numpy()[partners]
    np.testing.assert_allclose(mixed, expected, rtol=1e-5)


def test_cutmix_label_weight_is_the_pasted_area():
    images, labels = unique_batch()
    found_partial = False
    for seed in range(6):
        mixed, targets = augment.cutmix(
            images, labels, tf.constant([seed, 1]), alpha=1.0
        )
        np.testing.assert_allclose(targets.numpy().sum(axis=1), 1.0, rtol=1e-6)
        partners, own = partners_and_weight(targets)
        source = images.numpy()
        for i in np.flatnonzero(partners != np.arange(8)):
            pasted = np.all(mixed[i] == source[partners[i]], axis=-1)
            kept = np.all(mixed[i] == source[i], axis=-1)
            assert np.all(pasted | kept)
            assert own[i] == pytest.approx(1.0 - pasted.mean(), abs=1e-6)
            found_partial |= 0.0 < pasted.mean() < 1.0
            rows, cols = np.nonzero(pasted)
            if rows.size:  # One axis-aligned box.
                box = pasted[rows.min() : rows.max() + 1]
                assert box[:, cols.min() : cols.max() + 1].all()
    assert found_partial


def test_cutout_zeroes_one_square_per_image():
    images, _ = unique_batch()
    out = augment.cutout(images, SEED, size=4).numpy()
    zeroed = np.all(out == 0, axis=-1)
    for i in range(8):
        rows, cols = np.nonzero(zeroed[i])
        assert 0 < rows.size <= 16
        assert rows.max() - rows.min() < 4 and cols.max() - cols.min() < 4
        assert zeroed[i, rows.min() : rows.max() + 1][
            :, cols.min() : cols.max() + 1
        ].all()
        np.testing.assert_array_equal(
            out[i][~zeroed[i]], images.numpy()[i][~zeroed[i]]
        )
    # Different squares for different images.
    assert len({zeroed[i].tobytes() for i in range(8)}) > 1


@pytest.mark.parametrize(
    "apply",
    [
        lambda x, y, s: augment.mixup(x, y, s, 0.4),
        lambda x, y, s: augment.cutmix(x, y, s, 1.0),
        lambda x, y, s: (augment.cutout(x, s, 5), y),
        lambda x, y, s: augment.mix_batch(x, y, s, 8, 0.2, 1.0),
    ],
)
def test_deterministic_for_a_seed(apply):
    images, labels = unique_batch()
    first = apply(images, labels, SEED)
    again = tf.function(apply)(images, labels, SEED)
    other = apply(images, labels, tf.constant([4, 7], tf.int64))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])


def test_identity_when_switched_off():
    images, labels = unique_batch()
    for function in (augment.mixup, augment.cutmix):
        out_images, out_labels = function(images, labels, SEED, 0.0)
        assert out_images is images and out_labels is labels
    assert augment.cutout(images, SEED, 0) is images
    out_images, targets = augment.mix_batch(
        images, tf.range(8), SEED, 8, 0.0, 0.0
    )
    assert out_images is images
    np.testing.assert_array_equal(targets, np.eye(8))


def test_mix_batch_uses_both_methods_in_a_dataset_map():
    images, _ = unique_batch()
    dataset = (
        tf.data.Dataset.from_tensors((images, tf.range(8)))
        .repeat(16)
        .enumerate()
        .map(
            lambda step, batch: augment.mix_batch(
                *batch, tf.stack([tf.constant(0, tf.int64), step]), 8, 1.0, 1.0
            )
        )
    )
    kinds = set()
    for mixed, targets in dataset:
        assert targets.shape == (8, 8)
        np.testing.assert_allclose(targets.numpy().sum(axis=1), 1.0, rtol=1e-5)
        # cutmix keeps pixel values (copies), mixup blends them.
        copies = np.isin(mixed.numpy(), images.numpy()).mean()
        kinds.add("cutmix" if copies == 1.0 else "mixup")
    assert kinds == {"cutmix", "mixup"}

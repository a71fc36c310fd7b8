"""Classification losses with label smoothing, integer or soft labels."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_resnet.losses import classification_losses


def example(dtype=tf.float32):
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(0, 3, size=(6, 5)), dtype)
    labels = tf.constant([0, 4, 2, 2, 1, 3], tf.int32)
    return labels, logits


@pytest.mark.parametrize("smoothing", [0.1, 0.2])
def test_equals_keras_categorical_crossentropy_with_smoothing(smoothing):
    labels, logits = example()
    losses = classification_losses(labels, logits, 5, smoothing)
    assert losses.shape == (6,)
    reference = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=smoothing, reduction=None
    )(tf.one_hot(labels, 5), logits)
    np.testing.assert_allclose(losses, reference, rtol=1e-6)
    # And the definition: cross-entropy against the smoothed targets.
    targets = (1 - smoothing) * np.eye(5)[labels.numpy()] + smoothing / 5
    by_hand = -np.sum(targets * tf.nn.log_softmax(logits).numpy(), axis=-1)
    np.testing.assert_allclose(losses, by_hand, rtol=1e-5)


def test_no_smoothing_is_the_sparse_loss_exactly():
    labels, logits = example()
    sparse = keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True
    )
    np.testing.assert_array_equal(
        classification_losses(labels, logits, 5), sparse
    )
    for int_labels in (tf.cast(labels, tf.int64), labels.numpy()):
        np.testing.assert_array_equal(
            classification_losses(int_labels, logits, 5), sparse
        )


def test_soft_labels_from_mixing():
    labels, logits = example()
    mixed = 0.7 * tf.one_hot(labels, 5) + 0.3 * tf.one_hot(labels[::-1], 5)
    losses = classification_losses(mixed, logits, 5, 0.1)
    reference = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=0.1, reduction=None
    )(mixed, logits)
    np.testing.assert_allclose(losses, reference, rtol=1e-6)
    # Soft one-hot targets without smoothing give the sparse loss.
    np.testing.assert_allclose(
        classification_losses(tf.one_hot(labels, 5), logits, 5),
        classification_losses(labels, logits, 5),
        rtol=1e-6,
    )


def test_float64_logits_keep_their_dtype():
    labels, logits = example(tf.float64)
    assert classification_losses(labels, logits, 5, 0.1).dtype == tf.float64
    soft = tf.one_hot(labels, 5)  # float32 targets, float64 logits.
    assert classification_losses(soft, logits, 5).dtype == tf.float64


def test_bad_smoothing():
    labels, logits = example()
    with pytest.raises(ValueError, match="label_smoothing"):
        classification_losses(labels, logits, 5, 1.0)

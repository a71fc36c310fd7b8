"""Test-time augmentation by horizontal flips."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_resnet.models import cifar_resnet
from tf_resnet.tta import tta_logits


@pytest.fixture(scope="module")
def model_and_images():
    keras.utils.set_random_seed(0)
    model = cifar_resnet.cifar_resnet(8, 10, (8, 8, 3))
    images = tf.random.stateless_normal([4, 8, 8, 3], [1, 2])
    return model, images


def test_none_is_the_plain_inference_logits(model_and_images):
    model, images = model_and_images
    np.testing.assert_array_equal(
        tta_logits(model, images, "none"), model(images, training=False)
    )


def test_flip_is_the_mean_over_image_and_mirror(model_and_images):
    model, images = model_and_images
    plain = model(images, training=False).numpy()
    mirrored = model(images[:, :, ::-1, :], training=False).numpy()
    assert np.abs(plain - mirrored).max() > 1e-3  # The model is not symmetric.
    flipped = tta_logits(model, images, "flip")
    assert flipped.shape == (4, 10)
    np.testing.assert_allclose(
        flipped, (plain + mirrored) / 2, rtol=1e-5, atol=1e-6
    )
    # A mirrored batch gives the same averaged logits (flip invariance).
    np.testing.assert_allclose(
        tta_logits(model, images[:, :, ::-1, :], "flip"),
        flipped,
        rtol=1e-5,
        atol=1e-6,
    )
    # Inside a tf.function, as in an evaluation step.
    compiled = tf.function(lambda x: tta_logits(model, x, "flip"))
    np.testing.assert_allclose(compiled(images), flipped, rtol=1e-5, atol=1e-6)


def test_unknown_mode(model_and_images):
    model, images = model_and_images
    with pytest.raises(ValueError, match="one of none, flip"):
        tta_logits(model, images, "crop")

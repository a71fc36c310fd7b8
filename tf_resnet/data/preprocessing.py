"""Batch-level image preprocessing: the original CIFAR recipe, vectorised.

The classic example padded each image to 36x36, cropped a random 32x32
window, flipped left-right with probability 1/2 and standardised each image.
Here the same is done on a whole batch at once with stateless random ops
(one gather instead of B `random_crop` calls), so augmentation is cheap and
reproducible from the batch seed.

Normalisation is per image by default, as in the classic example; the
per-channel dataset statistics (`normalization="dataset"`) are what
torchvision-based recipes and ImageNet weights expect.
"""

import tensorflow as tf


def random_pad_crop_flip(images, seed, pad):
    """Pads by `pad`, crops back to the input size at random, flips at random.

    Args:
      images: float32 `[B, H, W, C]`.
      seed: stateless seed, int tensor of shape `[2]`.
      pad: pixels of zero padding on each side before cropping.

    Returns:
      float32 `[B, H, W, C]`, one independent crop and flip per image.
    """
    shape = tf.shape(images)
    batch, height, width = shape[0], shape[1], shape[2]
    crop_seed, flip_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 2)
    )
    offsets = tf.random.stateless_uniform(
        [2, batch], crop_seed, minval=0, maxval=2 * pad + 1, dtype=tf.int32
    )
    padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    rows = offsets[0][:, None] + tf.range(height)[None, :]
    cols = offsets[1][:, None] + tf.range(width)[None, :]
    cropped = tf.gather(padded, rows, axis=1, batch_dims=1)
    cropped = tf.gather(cropped, cols, axis=2, batch_dims=1)
    flip = tf.random.stateless_uniform([batch], flip_seed) < 0.5
    return tf.where(flip[:, None, None, None], cropped[:, :, ::-1], cropped)


def standardize(images):
    """Per-image standardisation, as in the original example."""
    return tf.image.per_image_standardization(images)


def finish_batch(
    images, labels, seed, *, pad, image_size=None, mean=None, std=None
):
    """Augments (when `seed` is given), normalises and resizes a batch.

    Args:
      images: uint8 or float `[B, H, W, 3]`, pixel values 0-255.
      labels: int `[B]`.
      seed: stateless seed `[2]` for training, `None` for evaluation.
      pad: padding of the random crop.
      image_size: optional output side length (e.g. 224 for ImageNet
        weights); `None` keeps the native size.
      mean: per-channel mean `[3]` on the 0-255 scale; with `std`,
        `(x - mean) / std` replaces the per-image standardisation.
      std: per-channel standard deviation `[3]`, same scale.

    Returns:
      `(images float32 [B, S, S, 3], labels int32 [B])`.
    """
    images = tf.cast(images, tf.float32)
    if seed is not None:
        images = random_pad_crop_flip(images, seed, pad)
    images = standardize(images) if mean is None else (images - mean) / std
    if image_size is not None:
        images = tf.image.resize(images, [image_size, image_size])
    return images, tf.cast(labels, tf.int32)

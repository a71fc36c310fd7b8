"""Test-time augmentation: average the logits of transformed test images.

Training with random horizontal flips teaches the network that a mirrored
image is the same class; at test time the mean of the logits of an image and
of its mirror is a cheap two-view ensemble that usually gains accuracy for
twice the inference cost. Both views go through the model as one batch.
"""

import tensorflow as tf

MODES = ("none", "flip")


def tta_logits(model, images, tta="none"):
    """Inference-mode logits of `images` `[B, H, W, C]`, augmented.

    Args:
      model: a Keras model returning logits.
      images: the batch (NHWC).
      tta: `"none"` (the model's logits) or `"flip"` (mean of the logits
        of each image and its horizontal mirror).

    Returns:
      `[B, num_classes]` logits in the model's output dtype.
    """
    if tta == "none":
        return model(images, training=False)
    if tta == "flip":
        batch = tf.shape(images)[0]
        both = tf.concat([images, tf.reverse(images, axis=[2])], axis=0)
        logits = model(both, training=False)
        return (logits[:batch] + logits[batch:]) / 2
    raise ValueError(f"tta must be one of {', '.join(MODES)}: {tta!r}")

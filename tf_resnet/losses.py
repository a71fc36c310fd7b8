"""Per-example classification losses, with optional label smoothing.

Label smoothing (Szegedy et al., 2016) trains against
`(1 - s) * one_hot + s / num_classes` instead of the one-hot target: the
logits stop growing once the right class is ahead, which regularises a
small network on a small dataset. The targets may also be soft already
(`[B, C]` from mixup or cutmix); smoothing is linear, so smoothing the
mixed targets equals mixing the smoothed ones.
"""

import keras
import tensorflow as tf


def classification_losses(labels, logits, num_classes, label_smoothing=0.0):
    """Cross-entropy of each example, from logits.

    Integer labels without smoothing use Keras' sparse cross-entropy, the
    loss the paper's recipe has always used (bit-for-bit the same numbers);
    everything else goes through Keras' `categorical_crossentropy` and its
    own `label_smoothing`.

    Args:
      labels: class indices `[B]` (any integer dtype) or target
        distributions `[B, num_classes]`.
      logits: `[B, num_classes]` (float32 or float64).
      num_classes: classes of the classifier.
      label_smoothing: `s` in [0, 1).

    Returns:
      `[B]` losses in the dtype of `logits`.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(
            f"label_smoothing must be in [0, 1), got {label_smoothing}"
        )
    labels = tf.convert_to_tensor(labels)
    if labels.dtype.is_integer:
        if not label_smoothing:
            return keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )
        labels = tf.one_hot(labels, num_classes, dtype=logits.dtype)
    return keras.losses.categorical_crossentropy(
        tf.cast(labels, logits.dtype),
        logits,
        from_logits=True,
        label_smoothing=label_smoothing,
    )

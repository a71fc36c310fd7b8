"""Batch augmentations: mixup, cutmix and cutout, as pure seeded functions.

Each function takes a batch `[B, H, W, C]` and a seed, a `[2]` integer
tensor as `tf.random.stateless_*` take, and nothing else random: the same
`(batch, seed)` always gives the same result, so a run that derives the
seed from `(--seed, step)` is reproducible and resumes exactly, in eager
code, a `tf.function` or a `tf.data` map alike.

* mixup (Zhang et al., 2018): every image and its target are blended with
  those of a partner from the same batch (a random permutation), with one
  coefficient `lam ~ Beta(alpha, alpha)` per batch.
* cutmix (Yun et al., 2019): one box, of area about `(1 - lam) * H * W`, is
  pasted from the partner; the targets mix by the box's exact area fraction
  after clipping to the image, not by `lam`.
* cutout (DeVries & Taylor, 2017): a `size x size` square at a uniformly
  random centre (partly outside the image near the borders) is set to zero,
  a different one per image. Applied after normalisation, zero is the
  dataset mean.

Targets are one-hot or already soft `[B, num_classes]`.
"""

import tensorflow as tf


def _split(seed, count):
    return tf.unstack(tf.random.experimental.stateless_split(seed, count))


def _beta(seed, alpha):
    """One sample of `Beta(alpha, alpha)`, as the ratio of two gammas."""
    first, second = _split(seed, 2)
    a = tf.random.stateless_gamma([], first, alpha)
    b = tf.random.stateless_gamma([], second, alpha)
    # Both gammas can underflow to 0 for a tiny alpha: then an even mix.
    return tf.where(a + b > 0, tf.math.divide_no_nan(a, a + b), 0.5)


def _partners(seed, images):
    """A random permutation of the batch: example i mixes with `perm[i]`."""
    size = tf.shape(images)[0]
    return tf.random.experimental.stateless_shuffle(tf.range(size), seed)


def _blend(first, second, weight):
    """`weight * first + (1 - weight) * second`, in `first`'s dtype."""
    weight = tf.cast(weight, first.dtype)
    return weight * first + (1.0 - weight) * tf.cast(second, first.dtype)


def mixup(images, labels_onehot, seed, alpha):
    """Blends each example with a partner: `lam * own + (1 - lam) * other`.

    Args:
      images: `[B, H, W, C]` float batch.
      labels_onehot: `[B, num_classes]` float targets.
      seed: `[2]` integer tensor.
      alpha: Beta parameter; 0 or less returns the batch unchanged.

    Returns:
      `(images, labels)`, the labels' weights summing to 1 per example.
    """
    if alpha <= 0:
        return images, labels_onehot
    lam_seed, partner_seed = _split(seed, 2)
    lam = _beta(lam_seed, alpha)
    partners = _partners(partner_seed, images)
    return (
        _blend(images, tf.gather(images, partners), lam),
        _blend(labels_onehot, tf.gather(labels_onehot, partners), lam),
    )


def _box_mask(height, width, centre_y, centre_x, box_h, box_w):
    """`[..., H, W, 1]` booleans of a box clipped to the image."""
    top = centre_y - box_h // 2
    left = centre_x - box_w // 2
    rows = tf.range(height)
    cols = tf.range(width)
    inside_rows = (rows >= top[..., None]) & (rows < (top + box_h)[..., None])
    inside_cols = (cols >= left[..., None]) & (cols < (left + box_w)[..., None])
    return (inside_rows[..., :, None] & inside_cols[..., None, :])[..., None]


def cutmix(images, labels_onehot, seed, alpha):
    """Pastes one box of a partner image into each image.

    The box has side `sqrt(1 - lam)` of the image's (rounded to pixels),
    `lam ~ Beta(alpha, alpha)`, and a uniformly random centre; the same box
    for the whole batch. The labels weigh the partner by the box's area
    fraction (after clipping), the image's own label by the rest.
    Arguments and result as for `mixup`.
    """
    if alpha <= 0:
        return images, labels_onehot
    lam_seed, partner_seed, box_seed = _split(seed, 3)
    lam = _beta(lam_seed, alpha)
    partners = _partners(partner_seed, images)
    shape = tf.shape(images)
    height, width = shape[1], shape[2]
    side = tf.sqrt(1.0 - lam)
    box_h = tf.cast(tf.round(side * tf.cast(height, tf.float32)), tf.int32)
    box_w = tf.cast(tf.round(side * tf.cast(width, tf.float32)), tf.int32)
    centre = tf.random.stateless_uniform(
        [2], box_seed, maxval=tf.int32.max, dtype=tf.int32
    ) % tf.stack([height, width])
    mask = _box_mask(height, width, centre[0], centre[1], box_h, box_w)
    area = tf.reduce_mean(tf.cast(mask, tf.float32))
    mixed = tf.where(mask[None], tf.gather(images, partners), images)
    labels = _blend(labels_onehot, tf.gather(labels_onehot, partners), 1 - area)
    return mixed, labels


def cutout(images, seed, size):
    """Zeroes a `size x size` square of each image (its own per image).

    Args:
      images: `[B, H, W, C]` batch.
      seed: `[2]` integer tensor.
      size: side of the square in pixels; 0 returns the batch unchanged.

    Returns:
      The batch with the squares set to 0.
    """
    if size <= 0:
        return images
    shape = tf.shape(images)
    centres = (
        tf.random.stateless_uniform(
            [shape[0], 2], seed, maxval=tf.int32.max, dtype=tf.int32
        )
        % shape[1:3]
    )
    mask = _box_mask(
        shape[1], shape[2], centres[:, 0], centres[:, 1], size, size
    )
    return tf.where(mask, tf.zeros_like(images), images)


def mix_batch(images, labels, seed, num_classes, mixup_alpha, cutmix_alpha):
    """Mixup or cutmix of a batch with integer or soft labels.

    With both alphas positive, a fair coin picks one of the two per batch
    (the switch of timm's `Mixup`); with one, that one; with neither, only
    the labels change, to one-hot targets.

    Args:
      images: `[B, H, W, C]` float batch.
      labels: `[B]` class indices or `[B, num_classes]` targets.
      seed: `[2]` integer tensor.
      num_classes: classes of the targets.
      mixup_alpha: Beta parameter of mixup (0: off).
      cutmix_alpha: Beta parameter of cutmix (0: off).

    Returns:
      `(images, targets)` with float targets `[B, num_classes]`.
    """
    labels = tf.convert_to_tensor(labels)
    if labels.dtype.is_integer:
        labels = tf.one_hot(labels, num_classes)
    coin_seed, mix_seed = _split(seed, 2)
    if mixup_alpha > 0 and cutmix_alpha > 0:
        use_cutmix = tf.random.stateless_uniform([], coin_seed) < 0.5
        return tf.cond(
            use_cutmix,
            lambda: cutmix(images, labels, mix_seed, cutmix_alpha),
            lambda: mixup(images, labels, mix_seed, mixup_alpha),
        )
    if cutmix_alpha > 0:
        return cutmix(images, labels, mix_seed, cutmix_alpha)
    return mixup(images, labels, mix_seed, mixup_alpha)


def batch_regularisation(images, labels, seed, num_classes, options):
    """Cutout, then mixup/CutMix, of a training batch as `options` ask.

    Args:
      images: the augmented, normalised batch `[B, H, W, C]`.
      labels: `[B]` class indices.
      seed: the batch's `[2]` seed (crop and flip used it; the draws here
        use seeds folded from it).
      num_classes: classes of the targets when the batch is mixed.
      options: `InputOptions` (`cutout_size`, `mixup_alpha`,
        `cutmix_alpha`).

    Returns:
      `(images, labels)`; labels are `[B, num_classes]` float targets when
      the batch is mixed, else unchanged.
    """
    if options.cutout_size:
        images = cutout(
            images,
            tf.random.experimental.stateless_fold_in(seed, 1),
            options.cutout_size,
        )
    if options.mixup_alpha or options.cutmix_alpha:
        images, labels = mix_batch(
            images,
            labels,
            tf.random.experimental.stateless_fold_in(seed, 2),
            num_classes,
            options.mixup_alpha,
            options.cutmix_alpha,
        )
    return images, labels

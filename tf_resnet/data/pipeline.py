"""The tf.data pipeline shared by every data source.

A source hands over a dataset of *elements* in file order (raw CIFAR records,
or image paths with labels) plus two functions: `element_fn` decodes one
element before batching (JPEG decoding), `batch_fn` turns a batch into
`(images float32 [B, H, W, 3], labels int32 [B])`. This module adds the parts
that must be the same for every source:

* sharding (one shard per Horovod rank or tf.distribute input pipeline);
* a seeded shuffle and stateless, per-batch-seeded augmentation, so the
  stream of training batches is a pure function of `(seed, step)`. A run
  resumed at step `s` skips `s` batches of *undecoded* elements and then sees
  exactly the batches an uninterrupted run would have seen;
* parallel decoding and prefetching with AUTOTUNE, without tf.data's
  autotuning thread (`pipeline_options`).
"""

import tensorflow as tf

from tf_resnet.data import preprocessing

AUTOTUNE = tf.data.AUTOTUNE


def make_pipeline(
    elements,
    batch_fn,
    *,
    training,
    batch_size,
    element_fn=None,
    seed=0,
    start_step=0,
    num_shards=1,
    shard_index=0,
    shuffle_buffer=10_000,
    cache=False,
):
    """Builds the input pipeline around a source's elements.

    Args:
      elements: `tf.data.Dataset` of undecoded elements, in file order.
      batch_fn: `fn(batch, seed) -> (images, labels)`, applied per batch;
        `seed` is a stateless-RNG seed `[2]` unique to the batch (training)
        or `None` (evaluation).
      training: shuffle, repeat forever and augment; otherwise every element
        exactly once, in order, with a final partial batch.
      batch_size: examples per batch of this pipeline (per replica/rank).
      element_fn: optional per-element decoder applied before batching.
      seed: seed of the shuffle and of the augmentation.
      start_step: training batches to skip (the step a run resumes at).
      num_shards: number of input pipelines reading disjoint shards.
      shard_index: which shard this pipeline reads.
      shuffle_buffer: elements in the shuffle buffer.
      cache: keep the undecoded elements in memory after the first epoch.

    Returns:
      A `tf.data.Dataset` of `(images, labels)` batches.
    """
    ds = elements
    if num_shards > 1:
        ds = ds.shard(num_shards, shard_index)
    if cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(
            shuffle_buffer, seed=seed, reshuffle_each_iteration=True
        )
        ds = ds.repeat()
        if start_step:
            ds = ds.skip(start_step * batch_size)
    ds = ds.with_options(pipeline_options())
    if element_fn is not None:
        ds = ds.map(element_fn, num_parallel_calls=AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=training)
    if training:
        base_seed = tf.constant([seed, shard_index], tf.int64)
        ds = ds.enumerate(start=start_step).map(
            lambda step, batch: batch_fn(batch, _batch_seed(base_seed, step)),
            num_parallel_calls=AUTOTUNE,
        )
    else:
        ds = ds.map(lambda batch: batch_fn(batch, None), AUTOTUNE)
    return ds.prefetch(AUTOTUNE)


def pipeline_options():
    """Deterministic order, and no autotuning thread to join at the end.

    tf.data's autotuner is a thread that sleeps between optimizations (the
    period doubles up to 60 s) and that an iterator's destructor joins.
    TensorFlow's `CancellationManager` runs the callback that wakes it
    before it marks itself cancelled, so the thread can wake, still see "not
    cancelled" and sleep out the rest of its period: dropping an iterator
    then blocks for up to a minute (observed as a pause between a run's
    final evaluation and `done:`, and possible after every evaluation).
    Without it, AUTOTUNE means TensorFlow's static defaults (one parallel
    call per core) and prefetch buffers still grow (the legacy autotuner,
    which needs no thread); the input stays far faster than the training
    step (bench/README.md).
    """
    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = False
    return options


def make_image_pipeline(
    elements,
    *,
    native_size,
    training,
    batch_size,
    to_images=None,
    default_pad=4,
    **options,
):
    """`make_pipeline` with the standard image finish of every source.

    Training batches are padded by `pad` (option, default `default_pad`),
    randomly cropped and flipped; all batches are standardised per image and
    resized when the `image_size` option differs from `native_size`.

    Args:
      elements: as for `make_pipeline`.
      native_size: side length of the source's images.
      training: as for `make_pipeline`.
      batch_size: as for `make_pipeline`.
      to_images: `fn(batch) -> (images, labels)` for batches that are not
        already dicts with `image` and `label`.
      default_pad: crop padding when the `pad` option is absent.
      **options: `image_size`, `pad`, and the options of `make_pipeline`.

    Returns:
      A `tf.data.Dataset` of `(images float32, labels int32)` batches.
    """
    image_size = options.pop("image_size", None)
    if image_size == native_size:
        image_size = None
    pad = options.pop("pad", default_pad)
    if to_images is None:
        to_images = lambda batch: (batch["image"], batch["label"])  # noqa: E731

    def batch_fn(batch, seed):
        images, labels = to_images(batch)
        return preprocessing.finish_batch(
            images, labels, seed, pad=pad, image_size=image_size
        )

    return make_pipeline(
        elements, batch_fn, training=training, batch_size=batch_size, **options
    )


def _batch_seed(base_seed, step):
    """A stateless-RNG seed that depends only on the run seed and the step."""
    return tf.random.experimental.stateless_fold_in(base_seed, step)

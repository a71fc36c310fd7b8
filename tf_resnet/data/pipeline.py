"""The tf.data pipeline shared by every data source.

A `Split` hands over a dataset of *elements* in file order (raw CIFAR
records, or image paths with labels) plus two functions: `element_fn`
decodes one element before batching (JPEG decoding), `batch_fn` turns a
batch into `(images float32 [B, H, W, 3], labels int32 [B])`. This module
adds the parts that must be the same for every source:

* sharding (one shard per Horovod rank or tf.distribute input pipeline);
* a seeded shuffle and stateless, per-batch-seeded augmentation, so the
  stream of training batches is a pure function of `(seed, step)`. A run
  resumed at step `s` skips `s` batches of *undecoded* elements and then sees
  exactly the batches an uninterrupted run would have seen;
* parallel decoding and prefetching with AUTOTUNE, without tf.data's
  autotuning thread (`pipeline_options`).
"""

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def make_pipeline(
    elements,
    batch_fn,
    *,
    training,
    batch_size,
    options,
    element_fn=None,
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
      options: `InputOptions`; this function uses `seed`, `start_step`,
        `num_shards`, `shard_index` and `shuffle_buffer`.
      element_fn: optional per-element decoder applied before batching.
      cache: keep the undecoded elements in memory after the first epoch.

    Returns:
      A `tf.data.Dataset` of `(images, labels)` batches.
    """
    ds = elements
    if options.num_shards > 1:
        ds = ds.shard(options.num_shards, options.shard_index)
    if cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(
            options.shuffle_buffer,
            seed=options.seed,
            reshuffle_each_iteration=True,
        )
        ds = ds.repeat()
        if options.start_step:
            ds = ds.skip(options.start_step * batch_size)
    ds = ds.with_options(pipeline_options())
    if element_fn is not None:
        ds = ds.map(_no_autograph(element_fn), num_parallel_calls=AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=training)
    if training:
        base_seed = tf.constant([options.seed, options.shard_index], tf.int64)
        ds = ds.enumerate(start=options.start_step).map(
            _no_autograph(
                lambda step, batch: batch_fn(
                    batch, _batch_seed(base_seed, step)
                )
            ),
            num_parallel_calls=AUTOTUNE,
        )
    else:
        ds = ds.map(
            _no_autograph(lambda batch: batch_fn(batch, None)), AUTOTUNE
        )
    return ds.prefetch(AUTOTUNE)


def _no_autograph(fn):
    """`fn` traced as written: the data functions use `tf.cond`, not `if`.

    AutoGraph would rewrite every function they call on each trace, which
    is a good part of a short run's start-up.
    """
    return tf.autograph.experimental.do_not_convert(fn)


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


def _batch_seed(base_seed, step):
    """A stateless-RNG seed that depends only on the run seed and the step."""
    return tf.random.experimental.stateless_fold_in(base_seed, step)

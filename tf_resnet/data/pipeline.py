"""The tf.data pipeline shared by every data source.

A `Split` hands over its *table*: a dataset of one element, the whole split
as tensors indexed by example in file order (raw CIFAR records, image
arrays, or image paths with labels), plus two functions: `element_fn`
decodes one element before batching (JPEG decoding), `batch_fn` turns a
batch into `(images float32 [B, H, W, 3], labels int32 [B])`. This module
adds the parts that must be the same for every source:

* the order: every training epoch is a seeded permutation of the WHOLE
  split (`training_order`), whatever its size, so batches never come in
  the order the files were listed (class by class for image folders). Only
  indices are permuted; examples are gathered from the table by index;
* sharding: every input pipeline (Horovod rank, worker, tf.distribute input
  pipeline) computes the same permutation and takes every `num_shards`-th
  position of it, as PyTorch's `DistributedSampler` does: between them the
  shards read each example once per epoch, and the examples of step `s`
  over all shards are those of one pipeline's global batch `s`;
* stateless, per-batch-seeded augmentation, so the stream of training
  batches is a pure function of `(seed, step)`. A run resumed at step `s`
  starts the order at its position and sees exactly the batches an
  uninterrupted run would have seen;
* parallel decoding and prefetching with AUTOTUNE, without tf.data's
  autotuning thread (`pipeline_options`).
"""

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE
# Stream of a `tf.random.experimental.stateless_fold_in` seed per purpose.
_ORDER_STREAM = 1
# Far beyond any run; `Dataset.range` needs an end.
_MAX_EPOCHS = 2**40


def make_pipeline(
    table,
    num_examples,
    batch_fn,
    *,
    training,
    batch_size,
    options,
    element_fn=None,
):
    """Builds the input pipeline around a source's table.

    Args:
      table: `tf.data.Dataset` of one element: a dict of tensors whose first
        dimension indexes the `num_examples` examples in file order.
      num_examples: examples in the table.
      batch_fn: `fn(batch, seed) -> (images, labels)`, applied per batch;
        `seed` is a stateless-RNG seed `[2]` unique to the batch (training)
        or `None` (evaluation).
      training: shuffled order, forever, augmented; otherwise every
        example of this shard exactly once, in file order, with a final
        partial batch.
      batch_size: examples per batch of this pipeline (per replica/rank).
      options: `InputOptions`; this function uses `seed`, `shuffle`,
        `start_step`, `num_shards` and `shard_index`.
      element_fn: optional per-element decoder applied before batching.

    Returns:
      A `tf.data.Dataset` of `(images, labels)` batches.
    """
    if training:
        order = training_order(num_examples, batch_size, options)
    else:
        order = tf.data.Dataset.range(
            options.shard_index, num_examples, options.num_shards
        )
    if element_fn is None:  # Gather whole batches: one op per batch.
        order = order.batch(batch_size, drop_remainder=training)

    def read(columns):
        def example(index):
            element = {
                key: tf.gather(column, index) for key, column in columns.items()
            }
            return element if element_fn is None else element_fn(element)

        # Gathering and decoding in one parallel map: one stage less.
        return order.map(_no_autograph(example), num_parallel_calls=AUTOTUNE)

    # Cached: an evaluation pipeline is iterated once per evaluation, and
    # its table (the records read, or TFDS's PNGs decoded) is built once.
    # The prefetch asks the cache for the element after the table's one at
    # once, so it sees the end and keeps what it read even when a pipeline
    # is dropped early (a training run's end, --eval_batch_count).
    ds = table.cache().prefetch(1).flat_map(_no_autograph(read))
    ds = ds.with_options(pipeline_options())
    if element_fn is not None:
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


def training_order(num_examples, batch_size, options):
    """The example indices one training pipeline reads, forever.

    Epoch `e` of the whole split is `stateless_shuffle(range(n))` seeded by
    `(options.seed, e)` (file order with `shuffle=False`); the epochs
    follow each other without a gap, and this pipeline takes positions
    `shard_index, shard_index + num_shards, ...` of that stream. A pipeline
    resumed at `start_step` starts at global position `start_step *
    batch_size * num_shards` by slicing that epoch's permutation: nothing
    is read and skipped.

    Args:
      num_examples: examples in the split.
      batch_size: examples per batch of this pipeline.
      options: `InputOptions` (`seed`, `shuffle`, `start_step`,
        `num_shards`, `shard_index`).

    Returns:
      `tf.data.Dataset` of int64 indices into the split.
    """
    shards = options.num_shards
    start = options.start_step * batch_size * shards
    first_epoch, offset = divmod(start, num_examples)
    order_seed = tf.random.experimental.stateless_fold_in(
        tf.constant([options.seed, 0], tf.int64), _ORDER_STREAM
    )

    def epoch(index):
        indices = tf.range(num_examples, dtype=tf.int64)
        if options.shuffle:
            indices = tf.random.experimental.stateless_shuffle(
                indices,
                tf.random.experimental.stateless_fold_in(order_seed, index),
                alg="philox",
            )
        begin = tf.where(index == first_epoch, offset, 0)
        return tf.data.Dataset.from_tensor_slices(indices[begin:])

    order = tf.data.Dataset.range(first_epoch, _MAX_EPOCHS).flat_map(
        _no_autograph(epoch)
    )
    if shards > 1:  # `start` is a multiple of `shards`: the phase is kept.
        order = order.shard(shards, options.shard_index)
    return order


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
    step (bench/results/input_pipeline.md, "tf.data autotuning off").
    """
    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = False
    return options


def _batch_seed(base_seed, step):
    """A stateless-RNG seed that depends only on the run seed and the step."""
    return tf.random.experimental.stateless_fold_in(base_seed, step)

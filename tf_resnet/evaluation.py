"""Evaluation: precision over the test files, in training or as its own job.

`evaluate` runs the model in inference mode over this process's shard of
the test set and sums the counts over all processes of the mode, so every
Horovod rank takes part (no rank-0-only evaluation that deadlocks the
others) and the result covers every record exactly once.

`continuous_eval` is the original `--mode=eval`: a separate process that
waits for new checkpoints in `--log_root`, evaluates each one and writes
`Precision` / `Best Precision` to `--eval_dir`.
"""

import time

import numpy as np
import tensorflow as tf
from absl import logging

from tf_resnet import data, summaries


def make_eval_step(model):
    """A compiled step returning `[correct, loss_sum, examples]` of a batch."""

    @tf.function
    def eval_step(images, labels):
        logits = tf.cast(model(images, training=False), tf.float32)
        losses = tf.keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True
        )
        correct = tf.equal(
            tf.argmax(logits, axis=-1, output_type=tf.int32), labels
        )
        return tf.stack(
            [
                tf.reduce_sum(tf.cast(correct, tf.float64)),
                tf.reduce_sum(tf.cast(losses, tf.float64)),
                tf.cast(tf.size(labels), tf.float64),
            ]
        )

    return eval_step


def evaluate(eval_step, dataset, mode, max_batches=None):
    """Precision and mean loss of the model over `dataset`.

    Args:
      eval_step: from `make_eval_step`.
      dataset: this process's shard of the evaluation data.
      mode: the distribution mode (sums the counts over processes).
      max_batches: stop after this many batches (`--eval_batch_count`).

    Returns:
      `dict(precision, loss, examples)`.
    """
    totals = np.zeros(3, np.float64)
    if max_batches:
        dataset = dataset.take(max_batches)
    for images, labels in dataset:
        totals += eval_step(images, labels).numpy()
    correct, loss_sum, examples = mode.all_reduce_sum(totals)
    examples = max(examples, 1.0)
    return {
        "precision": correct / examples,
        "loss": loss_sum / examples,
        "examples": int(examples),
    }


def build_eval_dataset(config, mode):
    """This process's shard of the evaluation split, in file order."""
    num_shards, shard_index = mode.eval_shard()
    split = data.open_split(
        config.dataset,
        config.eval_data_path,
        training=False,
        source=config.data_source,
    )
    return split.dataset(
        config.eval_batch_size or config.batch_size,
        data.InputOptions(
            num_shards=num_shards,
            shard_index=shard_index,
            image_size=config.image_size,
        ),
    )


def continuous_eval(config, mode, model, steps_per_epoch):
    """Evaluates every new checkpoint in `config.log_root`.

    Stops after one evaluation with `config.eval_once`, or when no new
    checkpoint has appeared for `config.eval_timeout_secs`.
    """
    checkpoint = tf.train.Checkpoint(model=model)
    writers = summaries.Writers(
        config.train_dir, config.eval_dir, mode.is_chief
    )
    history = summaries.EvalHistory(config.log_root, title=config.model)
    eval_step = make_eval_step(model)
    dataset = build_eval_dataset(config, mode)
    if config.eval_once:
        paths = [tf.train.latest_checkpoint(config.log_root)]
        if paths[0] is None:
            raise FileNotFoundError(
                f"{config.log_root}: no checkpoint to evaluate"
            )
    else:
        paths = tf.train.checkpoints_iterator(
            config.log_root,
            min_interval_secs=5,
            timeout=config.eval_timeout_secs,
        )
    for path in paths:
        checkpoint.restore(path).expect_partial()
        step = int(path.rsplit("-", 1)[1])
        start = time.time()
        result = evaluate(eval_step, dataset, mode, config.eval_batch_count)
        best = history.record(
            step, step / steps_per_epoch, result["precision"], result["loss"]
        )
        writers.write_eval(step, result, best)
        logging.info(
            "eval %s: precision %.4f, best %.4f, loss %.4f, %d examples, %.1fs",
            path,
            result["precision"],
            best,
            result["loss"],
            result["examples"],
            time.time() - start,
        )
    writers.close()

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


def build_eval_dataset(config, mode, split=None):
    """This process's shard of the evaluation split, in file order.

    `split`: the evaluation split if already opened (else opened here).
    """
    if split is None:
        split = data.open_split(
            config.data.dataset,
            config.data.split_path(training=False),
            training=False,
            source=config.data.data_source,
        )
    num_shards, shard_index = mode.eval_shard()
    return split.dataset(
        config.optim.eval_batch_size or config.optim.batch_size,
        data.InputOptions(
            num_shards=num_shards,
            shard_index=shard_index,
            image_size=config.data.image_size,
        ),
    )


class Evaluator:
    """Evaluates the model and records the result, in training or the job.

    Every process of the mode takes part (the counts are summed over them);
    the chief writes `eval.csv`, the learning curve and the TensorBoard
    `Precision` / `Best Precision` events.
    """

    def __init__(self, config, mode, state, split=None):
        self.mode = mode
        self.state = state
        self.max_batches = config.run.eval_batch_count
        self.step_fn = make_eval_step(state.model)
        self.dataset = build_eval_dataset(config, mode, split)
        self.writer = summaries.EvalWriter(config.run.eval_dir, mode.is_chief)
        self.history = summaries.EvalHistory(
            config.run.log_root, title=config.model.model
        )

    def __call__(self, step, epoch):
        """Evaluates the model as it is now; returns the result dict."""
        self.mode.synchronize(self.state)
        start = time.time()
        result = evaluate(
            self.step_fn, self.dataset, self.mode, self.max_batches
        )
        best = result["precision"]
        if self.mode.is_chief:
            best = self.history.record(
                step, epoch, result["precision"], result["loss"]
            )
            self.writer.write(step, result, best)
        logging.info(
            "eval at step %d: precision %.4f (best %.4f), loss %.4f over %d "
            "examples, %.1fs",
            step,
            result["precision"],
            best,
            result["loss"],
            result["examples"],
            time.time() - start,
        )
        return result

    def close(self):
        self.writer.close()


def continuous_eval(config, mode, state, epoch_of, split=None):
    """Evaluates every new checkpoint in `config.run.log_root`.

    `epoch_of(step)` gives the epoch of a checkpoint's step.

    Stops after one evaluation with `eval_once`, or when no new checkpoint
    has appeared for `eval_timeout_secs`.
    """
    run = config.run
    checkpoint = tf.train.Checkpoint(**state.checkpoint_objects())
    evaluator = Evaluator(config, mode, state, split)
    if run.eval_once:
        paths = [tf.train.latest_checkpoint(run.log_root)]
        if paths[0] is None:
            raise FileNotFoundError(
                f"{run.log_root}: no checkpoint to evaluate"
            )
    else:
        paths = tf.train.checkpoints_iterator(
            run.log_root, min_interval_secs=5, timeout=run.eval_timeout_secs
        )
    for path in paths:
        checkpoint.restore(path).expect_partial()
        step = int(path.rsplit("-", 1)[1])
        logging.info("evaluating %s", path)
        evaluator(step, epoch_of(step))
    evaluator.close()

"""Evaluation: precision over the test files, in training or as its own job.

`evaluate` runs the model in inference mode over this process's shard of
the test set and sums the counts over all processes of the distributor, so every
Horovod rank takes part (no rank-0-only evaluation that deadlocks the
others) and the result covers every record exactly once. The counts are
top-1 and top-5 hits, the loss and the confusion matrix, all summed in one
all-reduce.

`evaluate_only` is the original `--mode=eval`: a separate process that
builds the run's model and, in `continuous_eval`, waits for new
checkpoints in `--log_root`, evaluates each one and writes `Precision` /
`Best Precision` to `--eval_dir`. It keeps its own `eval.csv` and learning
curve there, so it never rewrites the training run's.
"""

import contextlib
import dataclasses
import functools
import os
import time

import numpy as np
import tensorflow as tf
from absl import logging

from tf_resnet import data, eval_report, summaries
from tf_resnet.builders import build_model, make_ema, plan_run
from tf_resnet.checkpointing import first_line, unreadable
from tf_resnet.config import datasets
from tf_resnet.config import layers as config_lib
from tf_resnet.distribute.base import TrainState
from tf_resnet.tta import tta_logits

# The scalar sums of an evaluation, in the order `batch_counts` stacks them.
SUMS = ("correct", "correct_at_5", "loss_sum", "examples")


def batch_counts(logits, labels):
    """What one batch adds to an evaluation, from the model's logits.

    Returns:
      `dict(sums, confusion)`: `sums` float64 `[4]` in the order of `SUMS`,
      `confusion` int64 `[classes, classes]`, rows the true class and
      columns the predicted one.
    """
    logits = tf.cast(logits, tf.float32)
    num_classes = logits.shape[-1]
    losses = tf.keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True
    )
    predictions = tf.argmax(logits, axis=-1, output_type=labels.dtype)
    in_top_5 = tf.math.in_top_k(labels, logits, k=min(5, num_classes))
    confusion = tf.math.confusion_matrix(
        labels, predictions, num_classes=num_classes, dtype=tf.int64
    )
    return {
        "sums": tf.stack(
            [
                tf.reduce_sum(
                    tf.cast(tf.equal(predictions, labels), tf.float64)
                ),
                tf.reduce_sum(tf.cast(in_top_5, tf.float64)),
                tf.reduce_sum(tf.cast(losses, tf.float64)),
                tf.cast(tf.size(labels), tf.float64),
            ]
        ),
        "confusion": confusion,
    }


def make_eval_step(model, tta="none"):
    """A compiled step returning the `batch_counts` of a batch.

    `tta="flip"` scores each image by the mean logits of it and its mirror.
    """

    @tf.function(autograph=False)
    def eval_step(images, labels):
        return batch_counts(tta_logits(model, images, tta), labels)

    return eval_step


def num_outputs(model):
    """The number of classes a (functional Keras) model scores."""
    return int(model.outputs[0].shape[-1])


def evaluate(eval_step, dataset, distributor, max_batches=None, *, num_classes):
    """Precision, top-5 precision, mean loss and the confusion matrix.

    Args:
      eval_step: from `make_eval_step`.
      dataset: this process's shard of the evaluation data.
      distributor: the distributor (sums the counts over processes).
      max_batches: stop after this many batches (`--eval_batch_count`).
      num_classes: the model's class count (the size of the matrix, known
        even to a process whose shard is empty).

    Returns:
      `dict(precision, precision_at_5, loss, examples, confusion)`.
    """
    sums = np.zeros(len(SUMS), np.float64)
    confusion = np.zeros((num_classes, num_classes), np.int64)
    if max_batches:
        dataset = dataset.take(max_batches)
    for images, labels in dataset:
        counts = eval_step(images, labels)
        sums += counts["sums"].numpy()
        confusion += counts["confusion"].numpy()
    # One all-reduce for everything; float64 holds counts exactly to 2**53.
    totals = distributor.all_reduce_sum(
        np.concatenate([sums, confusion.ravel().astype(np.float64)])
    )
    correct, correct_at_5, loss_sum, examples = totals[: len(SUMS)]
    confusion = np.rint(totals[len(SUMS) :]).astype(np.int64)
    examples = max(examples, 1.0)
    return {
        "precision": correct / examples,
        "precision_at_5": correct_at_5 / examples,
        "loss": loss_sum / examples,
        "examples": int(examples),
        "confusion": confusion.reshape(num_classes, num_classes),
    }


def build_eval_dataset(config, distributor, split=None):
    """This process's shard of the evaluation split, in file order.

    `split`: the evaluation split if already opened (else opened here).
    """
    if split is None:
        split = data.split_of(config, training=False)
    num_shards, shard_index = distributor.eval_shard()
    return split.dataset(
        distributor.batch.eval_batch,
        data.input_options(
            config, num_shards=num_shards, shard_index=shard_index
        ),
    )


class Evaluator:
    """Evaluates the model and records the result, in training or the job.

    Every process of the distributor takes part (the counts are summed over
    them); the chief alone writes: the TensorBoard events (`Precision`,
    `Best Precision`, `Precision@5`, the confusion-matrix image) and the
    report files (`eval_report`) in `eval_dir`, and the evaluation history
    (`eval.csv`, `learning_curve.png`): the training run's in `log_root`,
    the eval job's (`job=True`) in `eval_dir`, with the training run's
    curve drawn next to its own.
    """

    def __init__(self, config, distributor, state, split=None, *, job=False):
        run = config.run
        self.distributor = distributor
        self.state = state
        model = state.model
        self.max_batches = run.eval_batch_count
        self.num_classes = num_outputs(model)
        self.step_fn = make_eval_step(model, config.optim.eval_tta)
        self.dataset = build_eval_dataset(config, distributor, split)
        self.report_dir = run.eval_dir
        self.writer = summaries.EvalWriter(run.eval_dir, distributor.is_chief)
        self.job = job
        split_name = datasets.DATASETS[config.data.dataset].eval_split
        # The same model is four different course tasks: the title names
        # the data and the engine too.
        engine = "the eval job" if job else f"engine {distributor.name}"
        title = f"{config.model.model} on {config.data.dataset}, {engine}"
        if job:
            self.history = summaries.EvalHistory(
                run.eval_dir,
                title=title,
                label="eval job",
                compare={
                    "training": os.path.join(run.log_root, summaries.EVAL_CSV)
                },
                split=split_name,
            )
        else:
            self.history = summaries.EvalHistory(
                run.log_root,
                title=title,
                label="training",
                split=split_name,
            )
        self.class_names = None
        if distributor.is_chief:
            self.class_names = _class_names(run.log_root, split)

    def __call__(self, step, epoch, label=None, train=None):
        """Evaluates the model as it is now; returns the scalar results.

        `label` names what is evaluated in the log line (the eval job: the
        checkpoint; training: the step). `train`: the training batches'
        `{"accuracy", "loss"}` since the evaluation before, for the
        learning curve; the eval job takes training's row of the step.

        The confusion matrix is left out of the returned dict (it goes to
        the report files), so callers can log the result.
        """
        self.distributor.synchronize(self.state)
        start = time.time()
        ema = self.state.ema
        with ema.swapped() if ema else contextlib.nullcontext():
            result = evaluate(
                self.step_fn,
                self.dataset,
                self.distributor,
                self.max_batches,
                num_classes=self.num_classes,
            )
        confusion = result.pop("confusion")
        best = result["precision"]
        if self.distributor.is_chief:
            if self.job:
                train = self.history.training_row(step)
            best = self.history.record(
                step,
                epoch,
                result["precision"],
                result["loss"],
                result["precision_at_5"],
                train=train,
                examples=result["examples"],
            )
            image = eval_report.write_report(
                self.report_dir, step, confusion, self.class_names
            )
            self.writer.write(step, result, best, confusion_png=image)
            # The chief's line only: every process evaluates its share, and
            # the summed result another printed would repeat it.
            logging.info(
                "eval %s: precision %.4f (best %.4f), top-5 %.4f, loss "
                "%.4f over %d examples, %.1fs",
                label or f"at step {step}",
                result["precision"],
                best,
                result["precision_at_5"],
                result["loss"],
                result["examples"],
                time.time() - start,
            )
        return result

    def close(self):
        self.writer.close()


def _class_names(log_root, split):
    """Names of the classes: the training run's saved ones, else the split's.

    `None` when neither has names (the report then uses the indices).
    """
    plan = config_lib.read_plan(log_root) or {}
    if plan.get("class_names"):
        return plan["class_names"]
    return None if split is None else split.class_names


def evaluate_only(config, distributor):
    """`--mode=eval`: the separate evaluation job of the original example.

    Needs no training data and builds no optimizer: the model's class
    count comes from the evaluation split and the epoch of a checkpoint
    from the step plan the training run saved in `log_root`. Writes only
    to `--eval_dir` (never `log_root` itself: `validation.validate`).
    """
    split = data.split_of(config, training=False)
    model = build_model(config, distributor, split)
    continuous_eval(
        config,
        distributor,
        TrainState(model, ema=make_ema(config, distributor, model)),
        functools.partial(_epoch_of_step, config, distributor.batch),
        split,
    )


def _epoch_of_step(config, batch, step):
    """The epoch of `step` by the training run's saved plan (or its data).

    `batch`: the `batch_plan.BatchPlan` the plan of its data is made with.
    """
    plan = config_lib.read_plan(config.run.log_root)
    if plan is None:
        if not config.data.train_data_path:
            return float("nan")
        split = data.split_of(config, training=True)
        plan = dataclasses.asdict(plan_run(config, split, batch))
    return step / plan["steps_per_epoch"]


def continuous_eval(config, distributor, state, epoch_of, split=None):
    """Evaluates every new checkpoint in `config.run.log_root`.

    `epoch_of(step)` gives the epoch of a checkpoint's step.

    Stops after one evaluation with `eval_once`, or when no new checkpoint
    has appeared for `eval_timeout_secs`. A checkpoint that training
    deletes (its `--keep_checkpoints`) before it is restored is skipped
    with a warning.
    """
    run = config.run
    checkpoint = tf.train.Checkpoint(**state.checkpoint_objects())
    evaluator = Evaluator(config, distributor, state, split, job=True)
    for path in _checkpoint_paths(run):
        if not _restore(checkpoint, path, distributor):
            continue
        step = int(path.rsplit("-", 1)[1])
        evaluator(step, epoch_of(step), label=path)
        if run.eval_once:
            break
    evaluator.close()


def _checkpoint_paths(run):
    """The checkpoints to evaluate, as `tf.train.latest_checkpoint` names them.

    With `eval_once`, the latest one; if the job asks again (the one before
    was deleted before its restore), the then latest, unless unchanged.
    """
    if not run.eval_once:
        yield from tf.train.checkpoints_iterator(
            run.log_root, min_interval_secs=5, timeout=run.eval_timeout_secs
        )
        return
    seen = set()
    while True:
        path = tf.train.latest_checkpoint(run.log_root)
        if path is None and not seen:
            raise FileNotFoundError(
                f"{run.log_root}: no checkpoint to evaluate"
            )
        if path is None or path in seen:
            return
        seen.add(path)
        yield path


def _restore(checkpoint, path, distributor):
    """Restores the checkpoint at `path`; False if it is gone.

    Training deletes checkpoints beyond its `--keep_checkpoints`, also one
    the iterator has just named. Every process must agree to skip, or the
    ones that evaluate would wait for the others in the all-reduce.

    Raises:
      tf.errors.OpError: the checkpoint exists but cannot be restored.
    """
    problem = ""
    try:
        checkpoint.restore(path).expect_partial()
    except tf.errors.OpError as error:
        problem = unreadable(path)
        if not problem:
            raise
        logging.debug("restoring %s: %s", path, first_line(error))
    failed = distributor.all_reduce_sum(np.array([1.0 if problem else 0.0]))[0]
    if failed:
        logging.warning(
            "%s: skipped, deleted before it could be restored (training "
            "keeps only its newest --keep_checkpoints); %s",
            path,
            problem or "another process could not read it",
        )
    return not failed

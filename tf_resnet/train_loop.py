"""The one training loop, for every dataset, model and engine.

`train` runs it: the compiled step of one replica (`make_replica_fn`),
progress lines and summaries, the schedule of evaluations and checkpoints,
and stopping on a signal. What it trains is made by `builders`; the
separate `--mode=eval` job is `evaluation.evaluate_only`.

A custom `GradientTape` loop (not `model.fit`) because the
distributors need hooks `fit` does not offer: gradient all-reduce across Horovod
ranks, weight averaging between local steps, asynchronous dispatch to
parameter servers. The loop only talks to the `Distributor` interface.

Losses are summed over a replica's examples and divided by the examples of
one optimizer update (the distributor's batch plan, `update_batch`); the
distributor sums gradients over the replicas of an update. Weight decay is
the paper's L2 penalty `wd/2 * ||w||^2` on conv and dense kernels, divided
the same way.
"""

import contextlib
import functools
import math
import os
import signal
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tf_resnet import (
    data,
    evaluation,
    log_root_lock,
    param_groups,
    peer_watch,
    summaries,
)
from tf_resnet.builders import (
    build_model,
    build_optimizer,
    decayed_variables,
    make_ema,
    plan_run,
)
from tf_resnet.checkpointing import RunCheckpoints, check_writable
from tf_resnet.config import layers as config_lib
from tf_resnet.config import settings
from tf_resnet.distribute.base import TrainState
from tf_resnet.errors import UserInputError
from tf_resnet.losses import classification_losses
from tf_resnet.models import pretrained


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT arrived; a final checkpoint was written."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class PeerLost(RuntimeError):
    """A task of the run's cluster is gone; the message is the line to say.

    Raised for the errors the engine ends a lost peer's collectives with
    (`Distributor.lost_peer`); a silent peer that the engine waits on
    without end is `peer_watch`'s to end.
    """


def make_replica_fn(model, optimizer, distributor, config, ema=None):
    """One replica's forward, backward and update on its batch.

    Labels are class indices, or `[B, classes]` targets of a mixed batch
    (mixup/CutMix); with `ema`, the moving average follows each update.

    With `--accumulate_steps=K` above 1 (in the distributor's batch plan,
    as the update's batch is) the batch is split into K
    micro-batches, run one after another (one at a time: the memory of one
    micro-batch), whose gradients and metrics are summed before the one
    all-reduce and update: the first K-1 in a `tf.while_loop`, the last
    after it, outside the loop, so that its gradients appear one by one as
    a step's without accumulation and the distributor's all-reduce overlaps its
    backward pass (a loop's outputs exist only once it has ended).

    With `config.xla` the forward and backward pass (of each micro-batch)
    is compiled by XLA; the all-reduce and the update stay outside it,
    since they belong to the distributor (Horovod ops have no XLA kernels)
    and to the optimizer.

    Raises:
      UserInputError: the replica's batch does not split into
        `--accumulate_steps` micro-batches.
    """
    batch = distributor.batch
    update_examples = float(batch.update_batch)
    label_smoothing = config.optim.label_smoothing
    decay_scale = config.optim.weight_decay / 2.0 / batch.replicas_per_update
    decayed = {id(k) for k in decayed_variables(model)}
    steps = batch.accumulate_steps
    micro = batch.micro_batch

    def loss_gradients(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            # Losses in float32 at least, also under 16-bit mixed precision.
            dtype = tf.float64 if logits.dtype == tf.float64 else tf.float32
            logits = tf.cast(logits, dtype)
            losses = classification_losses(
                labels, logits, logits.shape[-1], label_smoothing
            )
            loss = tf.reduce_sum(losses) / update_examples
            scaled_loss = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled_loss, model.trainable_variables)
        return grads, _metrics(losses, logits, labels)

    def add_decay(grads):
        # The gradient of the L2 penalty decay_scale * ||w||^2 is
        # 2 * decay_scale * w: added directly, it is the same update as
        # differentiating the penalty without the penalty's forward and
        # backward ops (a few % of a ResNet step on CPU).
        return [
            _add_decay(g, v, 2.0 * decay_scale, optimizer)
            if id(v) in decayed
            else g
            for g, v in zip(grads, model.trainable_variables, strict=True)
        ]

    def forward_backward(images, labels):
        grads, metrics = loss_gradients(images, labels)
        return add_decay(grads), metrics

    def accumulated(images, labels):
        """The gradients and metrics of K micro-batches, summed; then decay."""
        images, labels = (
            tf.reshape(x, [steps, micro, *x.shape[1:]])
            for x in (images, labels)
        )
        variables = model.trainable_variables
        unused = set()  # Variables without a gradient: None, as for K=1.

        def add(micro_images, micro_labels, grads_sum, metrics_sum):
            grads, metrics = micro_step(micro_images, micro_labels)
            unused.update(j for j, g in enumerate(grads) if g is None)
            grads_sum = [
                s if g is None else s + g
                for s, g in zip(grads_sum, grads, strict=True)
            ]
            metrics_sum = {k: metrics_sum[k] + metrics[k] for k in metrics}
            return grads_sum, metrics_sum

        _, grads, metrics = tf.while_loop(
            lambda i, *_: i < steps - 1,
            lambda i, *sums: (i + 1, *add(images[i], labels[i], *sums)),
            (
                tf.constant(0),
                [tf.zeros(v.shape, v.dtype) for v in variables],
                {key: tf.constant(0.0) for key in _METRICS},
            ),
            # One micro-batch at a time: their memory is not held together.
            parallel_iterations=1,
        )
        # The last micro-batch once the loop has ended, for the same reason.
        with tf.control_dependencies([metrics["examples"]]):
            last = [tf.identity(x[steps - 1]) for x in (images, labels)]
        grads, metrics = add(*last, grads, metrics)
        grads = [None if j in unused else g for j, g in enumerate(grads)]
        return add_decay(grads), metrics

    micro_step = loss_gradients
    if config.runtime.xla:
        micro_step, forward_backward = (
            tf.function(fn, jit_compile=True, autograph=False)
            for fn in (micro_step, forward_backward)
        )
    if steps > 1:
        forward_backward = accumulated

    def replica_fn(images, labels):
        grads, metrics = forward_backward(images, labels)
        variables = model.trainable_variables
        grads = param_groups.scale_gradients(
            grads,
            variables,
            backbone=config.optim.backbone_lr_multiplier,
            head=config.optim.head_lr_multiplier,
        )
        grads = distributor.all_reduce_gradients(grads)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        if ema is not None:
            ema.update()
        return metrics

    return replica_fn


# The step's metrics, summed over replicas and between progress lines.
_METRICS = ("loss_sum", "correct", "examples")


def _metrics(losses, logits, labels):
    """A batch's summed loss, correct predictions and examples (float32)."""
    if len(labels.shape) == 2:  # Mixed targets: their largest share.
        labels = tf.argmax(labels, -1, output_type=tf.int32)
    correct = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels)
    return {
        "loss_sum": tf.cast(tf.reduce_sum(losses), tf.float32),
        "correct": tf.reduce_sum(tf.cast(correct, tf.float32)),
        "examples": tf.cast(tf.size(labels), tf.float32),
    }


def _add_decay(grad, variable, factor, optimizer):
    """`grad + factor * variable`, scaled like the loss (loss scaling)."""
    decay = optimizer.scale_loss(factor * variable.value)
    return decay if grad is None else grad + tf.cast(decay, grad.dtype)


class _StopSignal:
    """Turns SIGTERM/SIGINT into a flag the loop checks between steps."""

    def __init__(self):
        self.received = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            # ValueError off the main thread: leave signals alone there.
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        del frame
        self.received = signal.Signals(signum)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _Progress:
    """Accumulates step metrics between log lines; logs and summarises them.

    A line every `--log_every_steps`, and whenever `--log_every_secs`
    passed without one (a slow run is not taken for a hung one); the chief
    prints it, the other processes only check their own loss.

    Also the loop's guard against divergence: a non-finite loss stops the
    run, naming the step and the last good checkpoint.
    """

    def __init__(
        self,
        distributor,
        plan,
        writer,
        checkpoints,
        start_step,
        rate_fn,
        every_secs,
        watch,
    ):
        self.distributor = distributor
        self.watch = watch
        self.plan = plan
        self.writer = writer
        self.checkpoints = checkpoints
        self.rate_fn = rate_fn
        self.every_secs = every_secs
        self.pending = []
        self.interval_start = (start_step, time.time())
        self.interval = dict.fromkeys(_METRICS, 0.0)
        self.since_eval = dict.fromkeys(_METRICS, 0.0)

    def add(self, step_metrics):
        self.pending.append(step_metrics)

    def _fetch(self):
        """Adds the pending steps' metrics to the line's and the curve's."""
        for metrics in self.pending:
            for key, value in self.distributor.fetch(metrics).items():
                self.interval[key] += float(value)
                self.since_eval[key] += float(value)
        self.pending = []

    def training_since_eval(self):
        """`{"accuracy", "loss"}` of the batches since the last call.

        Over the batches as Keras' `History` reports an epoch (the mean
        over its examples; the data loss, without the weight decay); this
        process's batches, so the chief's for the learning curve. None when
        no batch ran since (a resumed run's first evaluation at its step).
        """
        self._fetch()
        totals = self.since_eval
        self.since_eval = dict.fromkeys(_METRICS, 0.0)
        if not totals["examples"]:
            return None
        return {
            "accuracy": totals["correct"] / totals["examples"],
            "loss": totals["loss_sum"] / totals["examples"],
        }

    @contextlib.contextmanager
    def paused(self):
        """Leaves the time of the block out of the next line's rate.

        An evaluation or a save in the interval would otherwise lower its
        images/sec and stretch its ETA. Its start and end are progress for
        the peer watch: the bound is on the block, not on it with the
        steps before it.
        """
        started = time.time()
        self.watch.mark()
        try:
            yield
        finally:
            self.watch.mark()
            step, since = self.interval_start
            self.interval_start = (step, since + time.time() - started)

    def due(self):
        """Whether `every_secs` passed since the last line (or the start).

        Each process asks its own clock: a line fetches only this
        process's metrics, so processes need not agree on when.
        """
        return time.time() - self.interval_start[1] >= self.every_secs

    def log(self, step):
        """Fetches pending metrics, logs a progress line, writes summaries.

        The rate is read after the fetch, which waits for pending
        (asynchronous) steps, so it belongs to the step it is logged at.
        """
        self._fetch()
        totals = self.interval
        if not totals["examples"]:
            return
        self.interval = dict.fromkeys(_METRICS, 0.0)
        first_step, first_time = self.interval_start
        now = time.time()
        self.interval_start = (step, now)
        batch = self.distributor.batch
        images_per_sec = batch.examples(step - first_step) / max(
            now - first_time, 1e-9
        )
        examples = max(totals["examples"], 1.0)
        result = {
            "loss": totals["loss_sum"] / examples,
            "accuracy": totals["correct"] / examples,
            "learning_rate": self.rate_fn(),
            "images_per_sec": images_per_sec,
        }
        remaining = batch.examples(self.plan.total_steps - step)
        # One line per step of the job: the other processes' would repeat
        # the chief's (or, between averages, differ by their shard only).
        if self.distributor.is_chief:
            logging.info(
                "step %d/%d (%.1f%%) epoch %.2f: loss %.4f, accuracy %.4f, "
                "lr %.4g, %.1f images/sec, ETA %s",
                step,
                self.plan.total_steps,
                100.0 * step / self.plan.total_steps,
                step / self.plan.steps_per_epoch,
                result["loss"],
                result["accuracy"],
                result["learning_rate"],
                images_per_sec,
                _format_eta(remaining / max(images_per_sec, 1e-9)),
            )
        if not math.isfinite(result["loss"]):
            raise TrainingDiverged(
                f"loss is {result['loss']} at step {step}; last good "
                f"checkpoint: {self.checkpoints.latest or 'none'}"
            )
        self.writer.write(step, result)


def _format_eta(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _TrainSteps:
    """The compiled training step, re-made when the backbone is unfrozen.

    A traced step keeps the variable list and BatchNorm mode it was traced
    with, so (un)freezing the backbone needs a new one.
    """

    def __init__(self, config, distributor, state, plan):
        self.make_replica_fn = functools.partial(
            make_replica_fn,
            state.model,
            state.optimizer,
            distributor,
            config,
            state.ema,
        )
        self.distributor = distributor
        self.model = state.model
        self.freeze_steps = round(
            config.optim.freeze_backbone_epochs * plan.steps_per_epoch
        )
        self.frozen = None
        self.step_fn = None

    def __call__(self, step, iterator):
        frozen = step < self.freeze_steps
        if self.step_fn is None or frozen != self.frozen:
            if self.frozen:
                logging.info("step %d: unfreezing the backbone", step)
            if self.freeze_steps:
                param_groups.set_backbone_trainable(self.model, not frozen)
            self.frozen = frozen
            self.step_fn = self.distributor.make_train_step(
                self.make_replica_fn()
            )
        return self.step_fn(iterator)


def train(config, distributor):
    """Trains, resuming from `config.run.log_root` if it has a checkpoint.

    The chief holds the run's lock for the whole run and, once the model
    is built and any checkpoint restored, saves the config and step plan,
    which the eval job, export and a resumed run read.

    Returns:
      dict with the final `step` and last evaluation `precision`.

    Raises:
      TrainingInterrupted: a process of the run got a stop signal; every
        process stopped at the same step, whose checkpoint is written.
      PeerLost: the engine failed a collective for a peer that is gone.
      (A peer silent for `--peer_timeout_secs` ends the process: there is
      no exception to raise in a thread stuck in a collective.)
    """
    # Refused before anything is read or written (`make_replica_fn` is
    # made at the first step).
    distributor.batch.micro_batch  # noqa: B018 (raises if it cannot split)
    split = data.split_of(config, training=True)
    # Both splits are read before anything is written in log_root: a run
    # that fails on its data leaves no config.json for the next to take.
    eval_split = data.split_of(config, training=False)
    # The weights file too (not read yet): a missing one is a failed start.
    pretrained.check_source(config.model.pretrained)
    plan = plan_run(config, split, distributor.batch)
    log_root = config.run.log_root
    new_folder = not os.path.exists(log_root)
    watch = peer_watch.PeerWatch(
        config.distribution.peer_timeout_secs, distributor.peers(), log_root
    )
    try:
        try:
            with watch:
                with contextlib.ExitStack() as held:
                    _start_together(log_root, distributor, held)
                    watch.mark()
                    result, interrupted = _train(
                        config, distributor, plan, split, eval_split, watch
                    )
                # Only now that the run's input iterator is released
                # (deleting one of MultiWorkerMirroredStrategy needs every
                # worker still there); after an agreed stop too, so no
                # process leaves while the chief still saves.
                distributor.end_of_run()
        except tf.errors.OpError as error:
            lost = distributor.lost_peer(error)
            if not lost:
                raise
            raise PeerLost(watch.line(lost)) from error
    except BaseException:
        if new_folder and distributor.is_chief:
            # A start that failed before writing anything leaves no empty
            # run folder behind (a non-empty one holds something of it).
            with contextlib.suppress(OSError):
                os.rmdir(log_root)
        raise
    if interrupted:
        raise interrupted
    return result


_CHIEF_FIRST_SECS = 3


def _start_together(log_root, distributor, held):
    """The chief takes `log_root` (onto `held`); every process learns if not.

    A refusal (another run holds the directory, or it cannot be written) is
    the chief's alone to see; told by one all-reduce, the other processes
    stop with a word of it instead of a lost chief's socket error.

    Raises:
      UserInputError: on the chief, its refusal; on the others, that the
        chief refused.
    """
    refusal = None
    if distributor.is_chief:
        try:
            check_writable(log_root)
            held.enter_context(log_root_lock.hold(log_root))
        except UserInputError as error:
            refusal = error
    refused = distributor.all_reduce_sum(np.array([int(refusal is not None)]))[
        0
    ]
    if refusal:
        raise refusal
    if refused:
        # The chief first: a launcher names the first process to fail.
        time.sleep(_CHIEF_FIRST_SECS)
        raise UserInputError(
            f"the chief refused the run at --log_root={log_root} (its "
            "error line says why); this process stops with it"
        )


def _train(config, distributor, plan, split, eval_split, watch):
    run = config.run
    keras.utils.set_random_seed(run.seed)
    model = build_model(config, distributor, split)
    optimizer = build_optimizer(
        config, distributor, model, plan.total_steps, plan.warmup_steps
    )
    state = TrainState(model, optimizer, make_ema(config, distributor, model))
    checkpoints = RunCheckpoints(
        run.log_root, run.keep_checkpoints, distributor, state
    )
    restored = checkpoints.restore()
    if distributor.is_chief:  # Only now: a refused checkpoint changes nothing.
        config_lib.save(config, plan, summaries.atomic_write)
        summaries.write_hparams(run.log_root, settings.flatten(config))
    distributor.broadcast_initial_state(state)
    step = int(optimizer.iterations.numpy())
    watch.mark(step)
    if restored:  # Each process's: one that resumed elsewhere would show.
        logging.info("resumed from %s at step %d", restored, step)
    if distributor.is_chief:  # The job's line; the others' would repeat it.
        logging.info(
            "training %s on %s: %d examples, %d steps/epoch, %d steps, "
            "global batch %d over %d replica(s) (%s)%s",
            config.model.model,
            config.data.dataset,
            plan.num_train_examples,
            plan.steps_per_epoch,
            plan.total_steps,
            distributor.batch.global_batch,
            distributor.batch.replicas,
            distributor.name,
            distributor.batch.describe_micro_batches(),
        )
        all_reduce = distributor.describe_all_reduce(
            state.model.trainable_variables, config.runtime.xla
        )
        if all_reduce:
            logging.info("gradient all-reduce: %s", all_reduce)
    iterator = distributor.distribute_dataset(
        functools.partial(_training_dataset, split, config, step)
    )
    train_step = _TrainSteps(config, distributor, state, plan)
    evaluator = evaluation.Evaluator(config, distributor, state, eval_split)
    writer = summaries.ScalarWriter(run.train_dir, distributor.is_chief)
    progress = _Progress(
        distributor,
        plan,
        writer,
        checkpoints,
        step,
        lambda: float(optimizer.learning_rate.numpy()),
        run.log_every_secs,
        watch,
    )
    run_until = plan.total_steps
    if run.steps_per_run:
        run_until = min(run_until, step + run.steps_per_run)
    last_eval = {}
    saved_at = interrupted = None
    with (
        _StopSignal() as stop,
        contextlib.closing(evaluator),
        contextlib.closing(writer),
    ):
        while step < run_until:
            progress.add(train_step(step, iterator))
            step += 1
            watch.mark(step)
            distributor.after_step(step, state)
            pause = step == run_until  # End of this run, maybe not of training.
            if step % run.log_every_steps == 0 or pause or progress.due():
                progress.log(step)
            if step % plan.checkpoint_every_steps == 0 or pause:
                progress.log(step)
                with progress.paused():
                    checkpoints.save(step)
                saved_at = step
            # Evaluation follows the schedule only, so a run split into
            # pieces has the same eval history as an uninterrupted one.
            if step % plan.eval_every_steps == 0 or step == plan.total_steps:
                with progress.paused():
                    last_eval = evaluator(
                        step,
                        step / plan.steps_per_epoch,
                        train=progress.training_since_eval(),
                    )
            # At steps every process knows: all ask, all stop at one step.
            if (
                step % distributor.stop_check_every_steps == 0 or pause
            ) and distributor.any_process_stopping(stop.received is not None):
                progress.log(step)
                if saved_at != step:
                    with progress.paused():
                        checkpoints.save(step)
                interrupted = _interruption(
                    stop.received, step, distributor, checkpoints
                )
                break
    return {"step": step, **last_eval}, interrupted


def _interruption(received, step, distributor, checkpoints):
    """The `TrainingInterrupted` of a stop at `step`, its checkpoint saved.

    A process that got no signal itself stops for its peer's and exits as
    if it had got SIGTERM (the scheduler's signal), so a job's processes
    end with one exit code. The line says how to go on: a run resumes by
    itself from its --log_root, so the command that started it.
    """
    if received:
        what, signum = f"{received.name} at step {step}", received
    else:
        what = f"stop requested by another process at step {step}"
        signum = signal.SIGTERM
    where = (
        f"to {checkpoints.latest}" if distributor.is_chief else "by the chief"
    )
    return TrainingInterrupted(
        f"{what}: checkpoint written {where}; the same command again "
        "resumes from it",
        int(signum),
    )


def _training_dataset(
    split, config, start_step, num_shards, shard_index, batch_size
):
    """One input pipeline of the training split (`distribute_dataset`)."""
    return split.dataset(
        batch_size,
        data.input_options(
            config,
            seed=config.run.seed,
            start_step=start_step,
            num_shards=num_shards,
            shard_index=shard_index,
        ),
    )

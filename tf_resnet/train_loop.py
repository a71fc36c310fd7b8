"""The one training loop, for every dataset, model and distribution mode.

A custom `GradientTape` loop (not `model.fit`) because the distribution
modes need hooks `fit` does not offer: gradient all-reduce across Horovod
ranks, weight averaging between local steps, asynchronous dispatch to
parameter servers. The loop only talks to the `DistributionMode` interface.

Losses are summed over a replica's examples and divided by the examples of
one optimizer update (`replica_batch * mode.replicas_per_update`); the mode
sums gradients over the replicas of an update. Weight decay is the paper's
L2 penalty `wd/2 * ||w||^2` on conv and dense kernels, divided the same way.
"""

import contextlib
import dataclasses
import functools
import math
import os
import signal
import tempfile
import time

import keras
import tensorflow as tf
from absl import logging

from tf_resnet import data, evaluation, models, schedules, summaries
from tf_resnet.errors import StorageError, UserInputError
from tf_resnet.models import pretrained


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT arrived; a final checkpoint was written."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclasses.dataclass
class TrainConfig:
    """Everything a training or evaluation run needs (filled from flags)."""

    dataset: str = "cifar10"
    train_data_path: str = ""
    eval_data_path: str = ""
    data_source: str = ""  # Empty: inferred by data.open_split.
    log_root: str = "/tmp/resnet_model"
    train_dir: str = ""
    eval_dir: str = ""
    model: str = "resnet20"
    model_options: dict = dataclasses.field(default_factory=dict)
    image_size: int | None = None
    batch_size: int = 128
    eval_batch_size: int = 0
    train_steps: int = 0
    train_epochs: float = 0.0
    base_learning_rate: float = 0.1
    lr_decay_fractions: tuple = (0.5, 0.75)
    lr_decay_rate: float = 0.1
    warmup_epochs: float = 0.0
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    log_every_steps: int = 100
    eval_every_steps: int = 0
    eval_batch_count: int = 0
    eval_once: bool = False
    eval_timeout_secs: float = 3600.0
    checkpoint_every_steps: int = 0
    keep_checkpoints: int = 5
    steps_per_run: int = 0
    shuffle_buffer: int = 10_000
    pretrained: str = ""
    freeze_backbone_epochs: float = 0.0
    backbone_lr_multiplier: float = 1.0
    xla: bool = False

    def __post_init__(self):
        self.train_dir = self.train_dir or os.path.join(self.log_root, "train")
        self.eval_dir = self.eval_dir or os.path.join(self.log_root, "eval")


@dataclasses.dataclass
class RunPlan:
    """Step counts derived from the data size and the config."""

    train_split: data.Split
    num_train_examples: int
    steps_per_epoch: int
    total_steps: int
    eval_every_steps: int
    checkpoint_every_steps: int
    warmup_steps: int


def plan_run(config):
    """Derives step counts; validates the training files on the way."""
    split = data.open_split(
        config.dataset,
        config.train_data_path,
        training=True,
        source=config.data_source,
    )
    num_train = split.num_examples
    steps_per_epoch = max(1, num_train // config.batch_size)
    if config.train_steps:
        total = config.train_steps
    elif config.train_epochs:
        total = max(1, math.ceil(config.train_epochs * steps_per_epoch))
    else:
        total = 64_000  # The paper's CIFAR schedule, at batch 128.
    eval_every = config.eval_every_steps or steps_per_epoch
    return RunPlan(
        train_split=split,
        num_train_examples=num_train,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        eval_every_steps=eval_every,
        checkpoint_every_steps=config.checkpoint_every_steps or eval_every,
        warmup_steps=round(config.warmup_epochs * steps_per_epoch),
    )


def build_model_and_optimizer(config, mode, split, total_steps, warmup_steps=0):
    """Creates model and SGD optimizer (with slots) in the mode's scope."""
    size = config.image_size or split.image_size
    update_batch = mode.replica_batch * mode.replicas_per_update
    with mode.scope():
        model = models.build_model(
            config.model,
            split.num_classes,
            (size, size, 3),
            pretrained=config.pretrained or None,
            **config.model_options,
        )
        schedule = schedules.make_schedule(
            config.base_learning_rate,
            update_batch,
            total_steps,
            config.lr_decay_fractions,
            config.lr_decay_rate,
            warmup_steps,
        )
        optimizer = keras.optimizers.SGD(schedule, momentum=config.momentum)
        if keras.config.dtype_policy().name == "mixed_float16":
            # float16 gradients underflow without loss scaling (GPU path).
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
        _count_steps_atomically(optimizer)
    return model, optimizer


def _count_steps_atomically(optimizer):
    """Makes the optimizer's step counter one `assign_add` op.

    Keras 3 increments `iterations` as `assign(iterations + 1)`, a read and
    then a write. Under asynchronous parameter-server training two workers
    read the same value and a step is lost (measured: 33 of 40 steps counted
    with 2 workers), which slows the learning-rate schedule and makes a
    resumed run restart from an earlier step than its checkpoint's. The
    `tf.Variable`'s own `assign_add` runs as one op on the parameter server;
    Keras' TF optimizer already updates the weights that way.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    counter = inner.iterations
    counter.assign_add = functools.partial(inner.assign_add, counter)


def decayed_variables(model):
    """Conv and dense kernels: the variables weight decay applies to."""
    return [v for v in model.trainable_variables if v.path.endswith("kernel")]


def make_replica_fn(model, optimizer, mode, config):
    """One replica's forward, backward and update on its batch.

    With `config.xla` the forward and backward pass is compiled by XLA; the
    all-reduce and the update stay outside it, since they belong to the
    mode (Horovod ops have no XLA kernels) and to the optimizer.
    """
    update_examples = float(mode.replica_batch * mode.replicas_per_update)
    decay_scale = config.weight_decay / 2.0 / mode.replicas_per_update
    decayed = {id(k) for k in decayed_variables(model)}

    def forward_backward(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            # Losses in float32 at least, also under 16-bit mixed precision.
            dtype = tf.float64 if logits.dtype == tf.float64 else tf.float32
            logits = tf.cast(logits, dtype)
            losses = keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )
            loss = tf.reduce_sum(losses) / update_examples
            scaled_loss = optimizer.scale_loss(loss)
        variables = model.trainable_variables
        grads = tape.gradient(scaled_loss, variables)
        # The gradient of the L2 penalty decay_scale * ||w||^2 is
        # 2 * decay_scale * w: added directly, it is the same update as
        # differentiating the penalty without the penalty's forward and
        # backward ops (a few % of a ResNet step on CPU).
        grads = [
            _add_decay(g, v, 2.0 * decay_scale, optimizer)
            if id(v) in decayed
            else g
            for g, v in zip(grads, variables, strict=True)
        ]
        return grads, losses, logits

    if config.xla:
        forward_backward = tf.function(forward_backward, jit_compile=True)

    def replica_fn(images, labels):
        grads, losses, logits = forward_backward(images, labels)
        variables = model.trainable_variables
        grads = pretrained.scale_backbone_gradients(
            grads, variables, config.backbone_lr_multiplier
        )
        grads = mode.all_reduce_gradients(grads)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        correct = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels)
        return {
            "loss_sum": tf.cast(tf.reduce_sum(losses), tf.float32),
            "correct": tf.reduce_sum(tf.cast(correct, tf.float32)),
            "examples": tf.cast(tf.size(labels), tf.float32),
        }

    return replica_fn


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
    """Accumulates step metrics between log lines and prints progress."""

    def __init__(self, mode, plan, global_batch, start_step):
        self.mode = mode
        self.plan = plan
        self.global_batch = global_batch
        self.pending = []
        self.start_step = start_step
        self.interval_start = (start_step, time.time())

    def add(self, step_metrics):
        self.pending.append(step_metrics)

    def flush(self, step, learning_rate_fn):
        """Fetches pending metrics; returns a dict for the summaries."""
        if not self.pending:
            return None
        totals = {"loss_sum": 0.0, "correct": 0.0, "examples": 0.0}
        for metrics in self.pending:
            for key, value in self.mode.fetch(metrics).items():
                totals[key] += float(value)
        self.pending = []
        first_step, first_time = self.interval_start
        now = time.time()
        self.interval_start = (step, now)
        steps_done = step - first_step
        images_per_sec = (
            steps_done * self.global_batch / max(now - first_time, 1e-9)
        )
        examples = max(totals["examples"], 1.0)
        result = {
            "loss": totals["loss_sum"] / examples,
            "accuracy": totals["correct"] / examples,
            "learning_rate": learning_rate_fn(),
            "images_per_sec": images_per_sec,
        }
        remaining = (self.plan.total_steps - step) * self.global_batch
        logging.info(
            "step %d/%d (%.1f%%) epoch %.2f: loss %.4f, accuracy %.4f, "
            "lr %.4g, "
            "%.1f images/sec, ETA %s",
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
        return result


def _format_eta(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def first_line(error):
    """The first line of an error's message: TensorFlow's run on for pages."""
    return (
        str(error).strip().splitlines()[0][:300] if str(error) else repr(error)
    )


def check_writable(directory):
    """Fails early, before hours of training, if outputs cannot be written."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise StorageError(
            f"{directory}: cannot write here ({error.strerror or error})"
        ) from error


def restore_checkpoint(checkpoint, manager, log_root):
    """Restores the latest checkpoint, if any; returns its path or None.

    Raises:
      UserInputError: the checkpoint does not fit the model (another
        architecture or class count), naming the checkpoint.
    """
    path = manager.latest_checkpoint
    if path is None:
        return None
    try:
        checkpoint.restore(path).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        raise UserInputError(
            f"{path}: checkpoint in --log_root={log_root} does not match this "
            f"model/optimizer ({first_line(error)}); use a fresh "
            "--log_root or the flags the checkpoint was trained with"
        ) from error
    return path


def train(config, mode):
    """Trains (resuming from `config.log_root` if it has a checkpoint).

    Returns:
      dict with the final `step` and last evaluation `precision`.
    """
    plan = plan_run(config)
    mode.set_global_batch(config.batch_size)
    if mode.is_chief:
        check_writable(config.log_root)
    keras.utils.set_random_seed(config.seed)
    model, optimizer = build_model_and_optimizer(
        config, mode, plan.train_split, plan.total_steps, plan.warmup_steps
    )
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(
        checkpoint, config.log_root, max_to_keep=config.keep_checkpoints
    )
    restored = restore_checkpoint(checkpoint, manager, config.log_root)
    mode.broadcast_initial_state(model, optimizer)
    step = int(optimizer.iterations.numpy())
    if restored:
        logging.info("resumed from %s at step %d", restored, step)
    logging.info(
        "training %s on %s: %d examples, %d steps/epoch, %d steps, global "
        "batch %d over %d replica(s) (%s)",
        config.model,
        config.dataset,
        plan.num_train_examples,
        plan.steps_per_epoch,
        plan.total_steps,
        config.batch_size,
        mode.num_replicas,
        mode.name,
    )

    def dataset_fn(num_shards, shard_index, batch_size):
        return plan.train_split.dataset(
            batch_size,
            data.InputOptions(
                seed=config.seed,
                start_step=step,
                num_shards=num_shards,
                shard_index=shard_index,
                shuffle_buffer=config.shuffle_buffer,
                image_size=config.image_size,
            ),
        )

    iterator = mode.distribute_dataset(dataset_fn)
    freeze_steps = round(config.freeze_backbone_epochs * plan.steps_per_epoch)
    frozen = step < freeze_steps

    def make_train_step():
        # A traced step keeps the variable list and BatchNorm mode it was
        # traced with, so (un)freezing the backbone needs a new one.
        if freeze_steps:
            pretrained.set_backbone_trainable(model, not frozen)
        return mode.make_train_step(
            make_replica_fn(model, optimizer, mode, config)
        )

    train_step = make_train_step()
    eval_step = evaluation.make_eval_step(model)
    eval_dataset = evaluation.build_eval_dataset(config, mode)
    writers = summaries.Writers(
        config.train_dir, config.eval_dir, mode.is_chief
    )
    history = summaries.EvalHistory(config.log_root, title=config.model)
    progress = _Progress(mode, plan, config.batch_size, step)
    last_eval = {}

    def learning_rate():
        return float(optimizer.learning_rate.numpy())

    def log_train_metrics():
        # The rate is read after the flush, which waits for pending
        # (asynchronous) steps, so it belongs to the step it is logged at.
        result = progress.flush(step, learning_rate)
        if result is None:
            return
        if not math.isfinite(result["loss"]):
            raise TrainingDiverged(
                f"loss is {result['loss']} at step {step}; last good "
                f"checkpoint: {manager.latest_checkpoint or 'none'}"
            )
        writers.write(writers.train, step, result)

    def save():
        mode.synchronize(model)
        if not mode.is_chief:
            return
        previous = manager.latest_checkpoint
        try:
            manager.save(checkpoint_number=step)
        except tf.errors.UnavailableError:
            raise  # A task of the cluster is gone, not the disk.
        except (OSError, tf.errors.OpError) as error:
            raise StorageError(
                f"{config.log_root}: writing the checkpoint of step {step} "
                f"failed ({first_line(error)}); the latest complete "
                f"checkpoint is {previous or 'none'}"
            ) from error

    def run_eval():
        mode.synchronize(model)
        result = evaluation.evaluate(
            eval_step, eval_dataset, mode, config.eval_batch_count
        )
        best = result["precision"]
        if mode.is_chief:
            best = history.record(
                step,
                step / plan.steps_per_epoch,
                result["precision"],
                result["loss"],
            )
            writers.write_eval(step, result, best)
        logging.info(
            "eval at step %d: precision %.4f (best %.4f), loss %.4f over %d "
            "examples",
            step,
            result["precision"],
            best,
            result["loss"],
            result["examples"],
        )
        last_eval.update(result)

    run_until = plan.total_steps
    if config.steps_per_run:
        run_until = min(run_until, step + config.steps_per_run)
    with _StopSignal() as stop:
        while step < run_until:
            if frozen and step >= freeze_steps:
                logging.info("step %d: unfreezing the backbone", step)
                frozen = False
                train_step = make_train_step()
            progress.add(train_step(iterator))
            step += 1
            mode.after_step(step, model, optimizer)
            final = step == plan.total_steps
            pause = step == run_until  # End of this run, maybe not of training.
            if step % config.log_every_steps == 0 or pause:
                log_train_metrics()
            if step % plan.checkpoint_every_steps == 0 or pause:
                log_train_metrics()
                save()
            # Evaluation follows the schedule only, so a run split into
            # pieces has the same eval history as an uninterrupted one.
            if step % plan.eval_every_steps == 0 or final:
                run_eval()
            if stop.received:
                log_train_metrics()
                save()
                writers.close()
                raise TrainingInterrupted(
                    f"{stop.received.name} at step {step}: checkpoint written "
                    f"to {manager.latest_checkpoint}",
                    int(stop.received),
                )
    writers.close()
    return {"step": step, **last_eval}


def evaluate_only(config, mode):
    """`--mode=eval`: the separate evaluation job of the original example."""
    plan = plan_run(config)
    mode.set_global_batch(config.batch_size)
    model, _ = build_model_and_optimizer(
        config, mode, plan.train_split, plan.total_steps
    )
    evaluation.continuous_eval(config, mode, model, plan.steps_per_epoch)

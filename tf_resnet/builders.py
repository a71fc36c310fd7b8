"""What a run is made of, made from its config: plan, model, optimizer, EMA.

One place builds each, so training, the `--mode=eval` job, export and the
benchmarks run the same model with the same optimizer: `plan_run` derives
the step counts from the training split, `build_model` and
`build_optimizer` make the model and SGD with its schedule in the distributor's
scope, `make_ema` the moving average a recipe may keep.
"""

import dataclasses
import math

import keras

from tf_resnet import models, schedules
from tf_resnet.ema import ExponentialMovingAverage


@dataclasses.dataclass
class RunPlan:
    """Step counts derived from the training split and the config.

    Saved in `config.json` with the config, together with what the model
    learned to output (class count, names, input size), so the eval job
    and export need neither the training data nor its flags.
    """

    num_train_examples: int
    steps_per_epoch: int
    total_steps: int
    eval_every_steps: int
    checkpoint_every_steps: int
    warmup_steps: int
    num_classes: int
    image_size: int
    class_names: list | None = None


def plan_run(config, split, batch):
    """Derives step counts from the opened training split.

    `batch`: the run's `batch_plan.BatchPlan` (`Distributor.batch`).
    """
    run = config.run
    num_train = split.num_examples
    steps_per_epoch = batch.steps_per_epoch(num_train)
    if run.train_steps:
        total = run.train_steps
    elif run.train_epochs:
        total = max(1, math.ceil(run.train_epochs * steps_per_epoch))
    else:
        total = 64_000  # The paper's CIFAR schedule, at batch 128.
    eval_every = run.eval_every_steps or steps_per_epoch
    return RunPlan(
        num_train_examples=num_train,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        eval_every_steps=eval_every,
        checkpoint_every_steps=run.checkpoint_every_steps or eval_every,
        warmup_steps=round(
            config.optim.warmup_epochs * steps_per_epoch
            or config.optim.warmup_fraction * total
        ),
        num_classes=split.num_classes,
        image_size=config.data.image_size or split.image_size,
        class_names=split.class_names,
    )


def build_model(config, distributor, info):
    """The model of the config, in the distributor's scope.

    `info` tells the class count and native image size: an opened
    `data.Split` (classes can come from the files) or `data.DATASETS` facts.
    """
    size = config.data.image_size or info.image_size
    with distributor.scope():
        return models.build_model(
            config.model.model,
            info.num_classes,
            (size, size, 3),
            pretrained=config.model.pretrained or None,
            **config.model.given(),
        )


def build_optimizer(config, distributor, model, total_steps, warmup_steps=0):
    """SGD with the run's schedule and its slots, in the distributor's scope.

    The schedule peaks at the rate of the distributor's batch plan (the
    config's `--learning_rate` scaled to the batch of one update).
    """
    optim = config.optim
    with distributor.scope():
        schedule = schedules.make_schedule(
            distributor.batch.peak_learning_rate,
            total_steps,
            optim.lr_decay_fractions,
            optim.lr_decay_rate,
            warmup_steps,
            kind=optim.lr_schedule,
            final_lr_fraction=optim.final_lr_fraction,
        )
        optimizer = keras.optimizers.SGD(
            schedule, momentum=optim.momentum, nesterov=optim.nesterov
        )
        if keras.config.dtype_policy().name == "mixed_float16":
            # float16 gradients underflow without loss scaling (GPU path).
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
        distributor.prepare_optimizer(optimizer)
    return optimizer


def decayed_variables(model):
    """Conv and dense kernels: the variables weight decay applies to."""
    return [v for v in model.trainable_variables if v.path.endswith("kernel")]


def make_ema(config, distributor, model):
    """The moving average of the model's weights, if the recipe has one."""
    if not config.optim.ema_decay:
        return None
    return ExponentialMovingAverage(
        model, config.optim.ema_decay, scope=distributor.scope()
    )

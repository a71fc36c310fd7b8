"""Modes backed by a `tf.distribute` strategy in one process.

`MirroredDistributor` runs synchronous SGD over several devices of one machine
(`--num_gpus=N`, or N logical CPU devices in tests): variables are mirrored,
gradients all-reduced by the Keras optimizer, and BatchNorm moving statistics
live in one mirrored variable, so replicas cannot disagree.

`--gradient_compression=fp16` casts the gradients to float16 for that
all-reduce, in the optimizer (`all_reduce_in_float16`): Keras 3's
optimizer sums them over the strategy's replicas itself, in
`apply_gradients`, and has no public way to be handed sums it must not
sum again.
"""

import keras
import tensorflow as tf

from tf_resnet.distribute import base

# The Keras 3 TensorFlow optimizer's all-reduce of the `(gradient,
# variable)` pairs over the strategy's replicas, called once per update
# (keras/src/backend/tensorflow/optimizer.py).
_KERAS_ALL_REDUCE = "_all_reduce_sum_gradients"


def all_reduce_in_float16(optimizer):
    """Makes the optimizer all-reduce float16 copies of the gradients.

    Its own all-reduce runs as before, once, on the gradients cast to
    float16; the sums are cast back to each gradient's dtype. A
    `LossScaleOptimizer`'s inner optimizer is the one that all-reduces
    (after unscaling).

    Raises:
      RuntimeError: this Keras has no such all-reduce to wrap.
    """
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    all_reduce = getattr(optimizer, _KERAS_ALL_REDUCE, None)
    if all_reduce is None:
        raise RuntimeError(
            f"Keras {keras.__version__}: its optimizer has no "
            f"{_KERAS_ALL_REDUCE} to compress; --gradient_compression=fp16 "
            "under tf.distribute needs Keras 3's TensorFlow optimizer"
        )

    def all_reduce_float16(grads_and_vars):
        pairs = list(grads_and_vars)
        reduced = all_reduce(
            [(g if g is None else tf.cast(g, tf.float16), v) for g, v in pairs]
        )
        return [
            (None if r is None else tf.cast(r, g.dtype), v)
            for (g, _), (r, v) in zip(pairs, reduced, strict=True)
        ]

    setattr(optimizer, _KERAS_ALL_REDUCE, all_reduce_float16)


class StrategyDistributor(base.Distributor):
    """Wraps any single-process `tf.distribute.Strategy`.

    Attributes:
      compression: `--gradient_compression` of the optimizer's all-reduce.
    """

    def __init__(self, strategy, name, optim, compression="none"):
        self.strategy = strategy
        self.name = name
        self.num_replicas = strategy.num_replicas_in_sync
        self.compression = compression
        super().__init__(optim)

    def scope(self):
        return self.strategy.scope()

    def prepare_optimizer(self, optimizer):
        """fp16 compression of the optimizer's gradient all-reduce."""
        if self.compression == "fp16":
            all_reduce_in_float16(optimizer)

    def distribute_dataset(self, dataset_fn):
        """One pipeline of global batches, split evenly over the replicas.

        Each step then sees exactly the examples (and augmentation) that a
        single device would see with the same global batch, so training is
        the same function of `(seed, step)` whatever the replica count.
        """
        dataset = dataset_fn(1, 0, self.batch.global_batch)
        return iter(self.strategy.experimental_distribute_dataset(dataset))

    def run(self, replica_fn, args):
        return self.strategy.run(replica_fn, args=args)

    def reduce_sum(self, per_replica_value):
        return self.strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica_value, axis=None
        )


def default_distributor(optim):
    """One device: the default strategy (a no-op wrapper).

    `optim`: the `settings.OptimConfig` whose batch it plans.
    """
    return StrategyDistributor(tf.distribute.get_strategy(), "default", optim)


def mirrored_distributor(optim, devices=None, compression="none"):
    """Synchronous all-reduce over the devices of this machine."""
    return StrategyDistributor(
        tf.distribute.MirroredStrategy(devices),
        "mirrored",
        optim,
        compression,
    )


def make_default_distributor(optim, dist, devices):
    """`--distribution=default`: the one device start-up chose, if any."""
    del dist  # Start-up has placed the devices.
    if devices:
        return StrategyDistributor(
            tf.distribute.OneDeviceStrategy(devices[0]), "default", optim
        )
    return default_distributor(optim)


def make_mirrored_distributor(optim, dist, devices):
    """`--distribution=mirrored` over the devices start-up chose."""
    return mirrored_distributor(optim, devices, dist.gradient_compression)

"""Modes backed by a `tf.distribute` strategy in one process.

`MirroredMode` runs synchronous SGD over several devices of one machine
(`--num_gpus=N`, or N logical CPU devices in tests): variables are mirrored,
gradients all-reduced by the Keras optimizer, and BatchNorm moving statistics
live in one mirrored variable, so replicas cannot disagree.
"""

import tensorflow as tf

from tf_resnet.distribute import base


class StrategyMode(base.DistributionMode):
    """Wraps any single-process `tf.distribute.Strategy`."""

    def __init__(self, strategy, name, global_batch):
        self.strategy = strategy
        self.name = name
        self.num_replicas = strategy.num_replicas_in_sync
        self.replicas_per_update = strategy.num_replicas_in_sync
        super().__init__(global_batch)

    def scope(self):
        return self.strategy.scope()

    def distribute_dataset(self, dataset_fn):
        """One pipeline of global batches, split evenly over the replicas.

        Each step then sees exactly the examples (and augmentation) that a
        single device would see with the same global batch, so training is
        the same function of `(seed, step)` whatever the replica count.
        """
        global_batch = self.replica_batch * self.num_replicas
        dataset = dataset_fn(1, 0, global_batch)
        return iter(self.strategy.experimental_distribute_dataset(dataset))

    def run(self, replica_fn, args):
        return self.strategy.run(replica_fn, args=args)

    def reduce_sum(self, per_replica_value):
        return self.strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica_value, axis=None
        )


def default_mode(global_batch):
    """One device: the default strategy (a no-op wrapper)."""
    return StrategyMode(tf.distribute.get_strategy(), "default", global_batch)


def mirrored_mode(global_batch, devices=None):
    """Synchronous all-reduce over the devices of this machine."""
    return StrategyMode(
        tf.distribute.MirroredStrategy(devices), "mirrored", global_batch
    )


def make_default_mode(global_batch, dist, devices):
    """`--distribution=default`: the one device start-up chose, if any."""
    del dist  # Start-up has placed the devices.
    if devices:
        return StrategyMode(
            tf.distribute.OneDeviceStrategy(devices[0]), "default", global_batch
        )
    return default_mode(global_batch)


def make_mirrored_mode(global_batch, dist, devices):
    """`--distribution=mirrored` over the devices start-up chose."""
    del dist
    return mirrored_mode(global_batch, devices)

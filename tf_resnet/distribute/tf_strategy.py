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

    def __init__(self, strategy, name):
        self.strategy = strategy
        self.name = name
        self.num_replicas = strategy.num_replicas_in_sync
        self.replicas_per_update = strategy.num_replicas_in_sync

    def scope(self):
        return self.strategy.scope()

    def distribute_dataset(self, dataset_fn):
        def input_fn(context):
            return dataset_fn(
                context.num_input_pipelines,
                context.input_pipeline_id,
                context.get_per_replica_batch_size(
                    self.replica_batch * self.num_replicas
                ),
            )

        return iter(self.strategy.distribute_datasets_from_function(input_fn))

    def run(self, replica_fn, args):
        return self.strategy.run(replica_fn, args=args)

    def reduce_sum(self, per_replica_value):
        return self.strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica_value, axis=None
        )


def default_mode():
    """One device: the default strategy (a no-op wrapper)."""
    return StrategyMode(tf.distribute.get_strategy(), "default")


def mirrored_mode(devices=None):
    """Synchronous all-reduce over the devices of this machine."""
    return StrategyMode(tf.distribute.MirroredStrategy(devices), "mirrored")

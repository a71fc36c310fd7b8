"""Periodic weight averaging (local SGD), the Ray ResNet example's algorithm.

`--distribution=averaging --average_every=N`: every Horovod rank trains on
its own shard of the data with its own optimizer, with no gradient
all-reduce, for N steps; then the weights, the BatchNorm moving statistics
and the optimizer's momentum slots are replaced by their mean over the ranks
in one fused all-reduce, and every rank continues from that mean.

The momentum slots are averaged too: otherwise each rank's momentum keeps
pushing it along its own shard's direction after every average, and the
chief's checkpoint would hold only its own momentum. With N=1 the run is
then exactly synchronous momentum SGD on every rank, weights and slots (the
mean of the ranks' updates is the update of the mean gradient). The step
counter is identical on all ranks and is left alone.

Each rank's step is an ordinary update on its own `global_batch / ranks`
examples, so the learning rate is scaled by that per-rank batch
(`replicas_per_update = 1`): with N=1 the run equals `--distribution=horovod`
at `1/ranks` of its learning rate. Pass `--learning_rate` times the number of
ranks to get the global-batch rate that local-SGD papers use.

This mode needs one process per replica: `tf.distribute.MirroredStrategy`
keeps one mirrored variable per weight, which cannot hold a different value
on each replica between averages.
"""

from tf_resnet.distribute import horovod_mode
from tf_resnet.errors import UserInputError


class AveragingMode(horovod_mode.HorovodMode):
    """Local steps on every rank, weights averaged every `average_every`."""

    name = "averaging"

    def __init__(self, global_batch, average_every=1):
        if average_every < 1:
            raise UserInputError(
                f"--average_every must be at least 1, got {average_every}"
            )
        super().__init__(global_batch)
        self.average_every = average_every
        self.replicas_per_update = 1

    def all_reduce_gradients(self, grads):
        """Unchanged: every rank updates on its own gradients."""
        return grads

    def after_step(self, step, state):
        """Every `average_every` steps: weights, BN stats, slots to the mean."""
        if step % self.average_every == 0:
            horovod_mode.average_in_place(
                horovod_mode.float_variables(state.variables)
            )

    def synchronize(self, state):
        """Averages all weights: between averages they differ on each rank."""
        horovod_mode.average_in_place(
            horovod_mode.float_variables(
                [*state.model.variables, *state.averages]
            )
        )

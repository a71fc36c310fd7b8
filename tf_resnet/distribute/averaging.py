"""Periodic weight averaging (local SGD), the Ray ResNet example's algorithm.

`--distribution=averaging --average_every=N`: every process trains on its
own shard of the data with its own optimizer, with no gradient all-reduce,
for N steps; then the weights, the BatchNorm moving statistics and the
optimizer's momentum slots are replaced by their mean over the processes in
one all-reduce, and every process continues from that mean.

The momentum slots are averaged too: otherwise each process's momentum
keeps pushing it along its own shard's direction after every average, and
the chief's checkpoint would hold only its own momentum. With N=1 the run
is then exactly synchronous momentum SGD on every process, weights and
slots (the mean of the updates is the update of the mean gradient). The
step counter is identical everywhere and is left alone.

Each process's step is an ordinary update on its own
`global_batch / processes` examples, so the learning rate is scaled by
that per-process batch (`local_updates`): with N=1 the run equals
synchronous SGD at `1/processes` of its learning rate. Pass
`--learning_rate` times the number of processes to get the global-batch
rate that local-SGD papers use.

Two transports carry the all-reduce; only it differs (`LocalSteps` is the
rest), and how the processes were started picks it
(`Engine.rides_on`, `registry.averaging_carrier`):

* TensorFlow's collectives (`multi_worker.MultiWorkerAveragingDistributor`) when
  the process is a worker of a multi-worker cluster: `--worker_hosts`, a
  `TF_CONFIG` of several workers and no ps (as `python -m
  tf_resnet.launch.tf_config_cluster` sets), or a Slurm job step of several
  tasks;
* Horovod (`horovod_ranks.HorovodAveragingDistributor`) otherwise: under
  `horovodrun` / `python -m tf_resnet.launch.horovod`.

Either way one process holds one replica: `tf.distribute.MirroredStrategy`
keeps one mirrored variable per weight, which cannot hold a different
value on each replica between averages. So `--num_gpus=N` in one process
is refused with the launcher command that runs N processes instead
(`registry`).
"""

_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def float_variables(variables):
    """The floating-point variables (not step counters or RNG states)."""
    return [v for v in variables if v.dtype in _FLOAT_DTYPES]


class LocalSteps:
    """Local steps, weights averaged every `average_every`: engine-free.

    A mixin before an engine's distributor class, which supplies the processes'
    data shards, metrics and `average_in_place(variables)`, the one
    all-reduce that differs between engines.
    """

    name = "averaging"
    local_updates = True

    def __init__(self, optim, average_every):
        super().__init__(optim)
        self.average_every = average_every

    def all_reduce_gradients(self, grads):
        """Unchanged: every process updates on its own gradients."""
        return grads

    def describe_all_reduce(self, variables, xla=False):
        """None of gradients: the weights are averaged instead."""
        del variables, xla
        return ""

    def after_step(self, step, state):
        """Every `average_every` steps: weights, BN stats, slots to the mean."""
        if step % self.average_every == 0:
            self.average_in_place(float_variables(state.variables))

    def synchronize(self, state):
        """Averages all weights: between averages they differ per process."""
        self.average_in_place(
            float_variables([*state.model.variables, *state.averages])
        )

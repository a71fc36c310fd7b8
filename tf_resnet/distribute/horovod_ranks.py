"""Synchronous data parallelism over processes with Horovod.

One process ("rank") per device, launched by `horovodrun` (or `mpirun`):

  horovodrun -np 2 -H localhost:2 --gloo python resnet_main.py \
      --distribution=horovod ...

Each rank reads its own shard of the data, computes gradients of its part of
the global batch and sums them over the ranks, so every rank applies the
same update (the semantics of `hvd.DistributedGradientTape`). The sums are
grouped all-reduces of gradient buckets, each issued as the backward pass
produces its gradients (`buckets`); `--nooverlap_all_reduce` sums them in
one group after the backward pass.
BatchNorm moving statistics are the one piece of state each rank updates from
its own data; `synchronize` averages them before evaluation and checkpoints,
so the ranks never disagree about the model they report.

Horovod 0.28 predates Keras 3: its variable helpers call `tf.Variable`
methods (`.ref()`) that Keras 3 variables lack (horovod issue 4290).
`tf_variables` hands Horovod the `tf.Variable` behind each Keras variable;
it is the only place that knows about this.
"""

import os
import socket

import horovod.tensorflow as hvd
import tensorflow as tf

from tf_resnet import traffic
from tf_resnet.distribute import averaging, base, buckets
from tf_resnet.distribute.averaging import float_variables

# How a Horovod op fails once Horovod has shut down.
_SHUT_DOWN = "Horovod has been shut down"
# What the all-reduce in flight fails with when its peer goes: the
# transport's exception (Horovod's `ExecuteOperation` turns it into an
# UnknownError), before the shutdown that every later collective reports.
_TRANSPORT_FAILURES = (
    "gloo/transport",
    "Timed out waiting",
    "Connection closed by peer",
    "Connection reset by peer",
)


def tf_variables(variables):
    """The `tf.Variable`s behind Keras 3 variables, which Horovod can handle.

    Variables that already are `tf.Variable`s (the EMA's averages) pass as
    they are: their `value` is a method, not a variable.
    """
    return [v if isinstance(v, tf.Variable) else v.value for v in variables]


def average_in_place(variables):
    """Replaces each variable by its mean over ranks (one fused all-reduce)."""
    if not variables:
        return
    means = hvd.grouped_allreduce(tf_variables(variables), op=hvd.Average)
    for variable, mean in zip(variables, means, strict=True):
        variable.assign(mean)


def set_cycle_time():
    """A longer Horovod cycle on CPU-only machines (before `hvd.init`).

    Horovod's background thread wakes every HOROVOD_CYCLE_TIME ms; at its
    1 ms default it takes CPU from ranks that share the cores (measured in
    bench/results/train_step.md, "What each change moved"). An explicit
    `horovodrun
    --cycle-time-ms` (the same variable) still wins.
    """
    if not tf.config.list_physical_devices("GPU"):
        os.environ.setdefault(
            "HOROVOD_CYCLE_TIME", f"{traffic.HOROVOD_CPU_CYCLE_MS:g}"
        )


def set_fusion_threshold(pack_bytes):
    """`--all_reduce_pack_bytes` as Horovod's fusion buffer (before `hvd.init`).

    Horovod fuses the tensors ready in one cycle into buffers of up to
    HOROVOD_FUSION_THRESHOLD bytes; 0 leaves its default. An explicit
    `horovodrun --fusion-threshold-mb` (the same variable) still wins.
    """
    if pack_bytes:
        os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", str(pack_bytes))


class HorovodDistributor(base.Distributor):
    """Synchronous SGD: gradients summed over all ranks every step."""

    name = "horovod"
    stop_check_every_steps = base.PEERS_STOP_CHECK_EVERY_STEPS

    def __init__(self, optim, compression="none", pack_bytes=0, overlap=True):
        """Starts Horovod.

        Args:
          optim: the `settings.OptimConfig`: its batch is split over the
            ranks (`base.Distributor.batch`).
          compression: `--gradient_compression`, the name of the
            `hvd.Compression` the gradients are all-reduced with.
          pack_bytes: `--all_reduce_pack_bytes`: the bucket size and
            Horovod's fusion threshold (0: the default bucket size and
            Horovod's own threshold).
          overlap: `--overlap_all_reduce`: one all-reduce per bucket as the
            gradients appear, else one group after the backward pass.
        """
        set_cycle_time()
        set_fusion_threshold(pack_bytes)
        hvd.init()  # Its GPU is the local rank's: `devices.plan`.
        self.bucket_bytes = traffic.bucket_bytes(pack_bytes) if overlap else 0
        self.compression = getattr(hvd.Compression, compression)
        self.num_replicas = hvd.size()
        self.is_chief = hvd.rank() == 0
        super().__init__(optim)

    def distribute_dataset(self, dataset_fn):
        """Each rank reads its own shard: no example is seen twice a step."""
        return iter(
            dataset_fn(hvd.size(), hvd.rank(), self.batch.replica_batch)
        )

    def eval_shard(self):
        """Every rank evaluates its shard; `all_reduce_sum` adds the counts."""
        return hvd.size(), hvd.rank()

    def all_reduce_gradients(self, grads):
        """Sums over ranks; each loss is already divided by the global batch.

        One grouped all-reduce per bucket (`buckets`), or of all of them.
        With `--gradient_compression=fp16`, of float16 copies (Horovod
        casts them and the sums back).
        """
        if not self.bucket_bytes:
            return self._sum(list(grads))
        return buckets.all_reduce(grads, self.bucket_bytes, self._sum)

    def _sum(self, tensors):
        return hvd.grouped_allreduce(
            tensors, op=hvd.Sum, compression=self.compression
        )

    def describe_all_reduce(self, variables, xla=False):
        """The gradient all-reduce, for the start line."""
        if not self.bucket_bytes:
            return "one group after the backward pass"
        return buckets.describe(variables, self.bucket_bytes, xla)

    def reduce_sum(self, per_replica_value):
        """Step metrics of all ranks, so every rank logs the global loss."""
        keys = sorted(per_replica_value)
        totals = hvd.grouped_allreduce(
            [per_replica_value[key] for key in keys], op=hvd.Sum
        )
        return dict(zip(keys, totals, strict=True))

    def all_reduce_sum(self, values):
        """Sums numpy values (evaluation counts) over ranks."""
        return hvd.allreduce(tf.constant(values), op=hvd.Sum).numpy()

    def broadcast_initial_state(self, state):
        """Rank 0's state wins: fresh, or restored from a checkpoint.

        The loop calls this after the restore, so a resumed run continues
        from the chief's checkpoint on every rank.
        """
        hvd.broadcast_variables(tf_variables(state.variables), root_rank=0)

    def synchronize(self, state):
        """Averages BN moving statistics; trainable weights already agree."""
        average_in_place(float_variables(state.local_variables))

    def any_process_stopping(self, stopping):
        """Whether any rank got a stop signal: all then stop together."""
        flag = tf.constant([1.0 if stopping else 0.0], tf.float32)
        total = hvd.allreduce(flag, op=hvd.Sum, name="any_process_stopping")
        return bool(total.numpy()[0] > 0)

    def lost_peer(self, error):
        """Horovod shut down: Gloo's timeout, or another rank's failure.

        Either ends Horovod's background thread, and every collective
        after that fails with its shutdown message (the cause is logged
        above it); the one in flight then fails with the transport's own.
        """
        if isinstance(error, tf.errors.UnknownError):
            said = str(error)
            if _SHUT_DOWN in said:
                return f"{_SHUT_DOWN}: a peer failed or timed out, said above"
            if any(failure in said for failure in _TRANSPORT_FAILURES):
                return (
                    "an all-reduce in flight failed "
                    f"({base.error_words(error)}), and Horovod shut down"
                )
        return super().lost_peer(error)

    def peers(self):
        """The other ranks and their hosts (one gather of the host names)."""
        if hvd.size() == 1:
            return ""
        hosts = hvd.allgather_object(socket.gethostname(), name="peers")
        return base.name_peers("rank", hvd.rank(), hosts)

    def end_of_run(self):
        """Waits until every rank got here, rank 0 with its checkpoint saved.

        After a stop, ranks exit with a signal's code, and `horovodrun`
        terminates the others once one exits non-zero: rank 0 must not be
        still writing then.
        """
        hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="end_of_run")

    def shutdown(self):
        """Stops Horovod's background thread so the process can exit."""
        hvd.shutdown()


class HorovodAveragingDistributor(averaging.LocalSteps, HorovodDistributor):
    """`--distribution=averaging` on Horovod ranks (`averaging.py`)."""

    def average_in_place(self, variables):
        """One fused Horovod all-reduce of all of them."""
        average_in_place(variables)


def make_distributor(optim, dist, devices):
    """`--distribution=horovod`; start-up gave the rank its device."""
    del devices
    return HorovodDistributor(
        optim,
        dist.gradient_compression,
        dist.all_reduce_pack_bytes,
        dist.overlap_all_reduce,
    )


def make_averaging_distributor(optim, dist, devices):
    """`--distribution=averaging` on Horovod ranks."""
    del devices
    return HorovodAveragingDistributor(optim, dist.average_every)

"""The interface between the training loop and a distributor.

One class per engine, in the manner of tf_cnn_benchmarks' `VariableMgr`
classes: the training loop (`tf_resnet.train_loop`) calls only the methods
below and never asks which engine it runs under. A distributor decides

* where variables live (`scope`),
* how the global batch is split and which shard of the data each input
  pipeline reads (`distribute_dataset`, `eval_shard`),
* how one replica step runs and how gradients combine (`run`,
  `all_reduce_gradients`),
* what crosses processes at the edges of a step (`after_step`,
  `broadcast_initial_state`, `all_reduce_sum`, `synchronize`,
  `any_process_stopping`),
* which process writes checkpoints and summaries (`is_chief`,
  `checkpoint_dir`).
"""

import contextlib
import dataclasses

import tensorflow as tf

from tf_resnet import batch_plan

# `stop_check_every_steps` of distributors whose processes must agree on a stop:
# one all-reduce of a flag is a few ms, a noticeable part of a small step
# (bench/results/stop_check.md), and nine steps more are seconds.
PEERS_STOP_CHECK_EVERY_STEPS = 10
# The errors of a collective whose peer is gone: a closed connection, a
# timed-out collective (multi_worker's CommunicationOptions) or the
# coordination service's heartbeat.
LOST_TASK_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)


def error_words(error):
    """The first sentence of what a TensorFlow error says went wrong.

    A function's error opens with "Graph execution error:" and where the
    failed op was defined, a traceback; the cause follows it.
    """
    lines = str(error).strip().splitlines()
    traced = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    after = lines[traced[-1] + 1 :] if traced else lines
    said = next((line.strip() for line in after if line.strip()), repr(error))
    return said.split(". ")[0].rstrip(".")[:300]


def name_peers(kind, index, places):
    """`rank 1 on node2, rank 2 on node3`: every process but `index`.

    Args:
      kind: what a process is called (`rank`, `worker`).
      index: this process's index in `places`.
      places: where each process runs (its host, or host:port).
    """
    return ", ".join(
        f"{kind} {i} on {place}" for i, place in enumerate(places) if i != index
    )


@dataclasses.dataclass
class TrainState:
    """What training changes, handed to the distributor as one object.

    Attributes:
      model: the Keras model (weights and BatchNorm moving statistics).
      optimizer: its optimizer (step counter and slots).
      ema: an `ema.ExponentialMovingAverage` of the model, or None.
    """

    model: object
    optimizer: object = None
    ema: object = None

    @property
    def variables(self):
        """Every variable of the state: model, optimizer, averages."""
        slots = self.optimizer.variables if self.optimizer else []
        return [*self.model.variables, *slots, *self.averages]

    @property
    def local_variables(self):
        """What each replica updates from its own data, not by gradients.

        BatchNorm moving statistics and, with them, their averages.
        """
        return [*self.model.non_trainable_variables, *self.averages]

    @property
    def averages(self):
        """The moving averages of the model's variables (none without EMA)."""
        return list(self.ema.averages.values()) if self.ema else []

    def checkpoint_objects(self):
        """What a `tf.train.Checkpoint` of the state holds, by name."""
        objects = {"model": self.model}
        if self.optimizer is not None:
            objects["optimizer"] = self.optimizer
        if self.ema is not None:
            objects["ema"] = self.ema
        return objects


class Distributor:
    """Single process, one device: the default `tf.distribute` strategy.

    Subclasses override what differs. Attributes:
      name: the `--distribution` value.
      num_replicas: replicas the global batch is split over (all devices of
        all processes).
      local_updates: each replica updates on its own gradients (local
        steps between weight averages), so one update is one replica's
        batch; otherwise the gradients of all `num_replicas` make it.
      batch: the `batch_plan.BatchPlan` of the run on these replicas: the
        replica's, the update's and the global batch, the micro-batches,
        the peak learning rate.
      is_chief: this process writes checkpoints, summaries and plots.
      stop_check_every_steps: how often the loop asks
        `any_process_stopping`, by step number, so every process asks at
        the same steps; a stop takes effect up to this many steps minus one
        after the signal.
    """

    name = "default"
    num_replicas = 1
    local_updates = False
    is_chief = True
    stop_check_every_steps = 1

    def __init__(self, optim):
        """Plans the batch of `optim` (the `settings.OptimConfig`).

        Subclasses set `num_replicas` first.

        Raises:
          UserInputError: the global batch does not split over the replicas.
        """
        self.batch = batch_plan.plan(
            optim,
            self.num_replicas,
            1 if self.local_updates else self.num_replicas,
            self.name,
        )

    def scope(self):
        """Context in which the model, optimizer and metrics are created."""
        return contextlib.nullcontext()

    def distribute_dataset(self, dataset_fn):
        """Returns an iterator of per-replica batches.

        Args:
          dataset_fn: `fn(num_shards, shard_index, replica_batch)` returning
            the `tf.data.Dataset` of one input pipeline.
        """
        return iter(dataset_fn(1, 0, self.batch.replica_batch))

    def eval_shard(self):
        """`(num_shards, shard_index)` of this process's evaluation data."""
        return 1, 0

    def prepare_optimizer(self, optimizer):
        """Adapts a freshly built optimizer to the distributor, in its scope."""

    def make_train_step(self, replica_fn):
        """Compiles a training step: next batch, `replica_fn` on each replica.

        Returns:
          `fn(iterator)` returning the step's metrics summed over replicas
          (for asynchronous engines, a handle that `fetch` resolves).
        """

        @tf.function(autograph=False)
        def train_step(iterator):
            return self.reduce_sum(self.run(replica_fn, next(iterator)))

        return train_step

    def fetch(self, value):
        """Resolves what a train step returned into numpy values."""
        return tf.nest.map_structure(lambda v: v.numpy(), value)

    def run(self, replica_fn, args):
        """Runs `replica_fn(*args)` on each replica: per-replica values."""
        return replica_fn(*args)

    def reduce_sum(self, per_replica_value):
        """Sums a per-replica value over the replicas of this process."""
        return per_replica_value

    def all_reduce_gradients(self, grads):
        """Combines gradients across replicas before `apply_gradients`.

        tf.distribute strategies return them unchanged (the Keras optimizer
        sums over the strategy's replicas itself); Horovod sums over ranks.
        """
        return grads

    def describe_all_reduce(self, variables, xla=False):
        """How the gradients of `variables` cross processes, for the start line.

        Empty for a distributor whose gradients cross no process boundary.
        """
        del variables, xla
        return ""

    def all_reduce_sum(self, values):
        """Sums numpy values over processes (evaluation counts, metrics)."""
        return values

    def broadcast_initial_state(self, state):
        """Makes every process start from the same `TrainState`."""

    def after_step(self, step, state):
        """Hook after each optimizer step (e.g. periodic weight averaging)."""

    def any_process_stopping(self, stopping):
        """Whether any process of the job was asked to stop (a stop signal).

        Every process calls this at the same steps, so processes in step
        with each other stop together: one that got no signal learns of its
        peer's here instead of waiting for it in the next collective. One
        process (or a coordinator that alone runs the loop): its own flag.
        """
        return bool(stopping)

    def synchronize(self, state):
        """Makes every replica's copy of the `TrainState` identical.

        Called before evaluation and checkpointing. Modes whose replicas keep
        their own BatchNorm moving statistics average them here, so replicas
        never disagree in accuracy.
        """

    def lost_peer(self, error):
        """What `error` says of a lost peer, in words; None: not that.

        How this engine's collectives fail when a peer is gone (one the
        engine waits on without end is `peer_watch`'s to end).
        """
        if isinstance(error, LOST_TASK_ERRORS):
            return error_words(error)
        return None

    def peers(self):
        """Who this process waits on, in words, or "" for no one.

        For the line of a process that lost its peers (`peer_watch`); the
        training loop watches only a process that has some. Every process
        of the run calls it at the same point (it may be a collective).
        """
        return ""

    def checkpoint_dir(self, log_root):
        """Where this process writes a checkpoint; None: it writes none.

        `log_root` for the chief. A distributor whose every process must take
        part in saving (MultiWorkerMirroredStrategy) gives the others a fresh
        directory, which is removed after the save.
        """
        return log_root if self.is_chief else None

    def end_of_run(self):
        """Called by every process once its training has ended in order.

        At the end of the run, or after a stop all processes agreed on
        (`any_process_stopping`); not after a failure: a distributor may wait
        here for its peers.
        """

    def shutdown(self):
        """Releases the distributor's resources (collectives, cluster)."""

"""The batch of a run, worked out once: `plan` makes one frozen `BatchPlan`.

`--batch_size` is the global batch of one step, split evenly over every
replica in sync; an optimizer update sums the gradients of
`replicas_per_update` of them (all of them in synchronous SGD, one where
each replica updates on its own); `--accumulate_steps` splits each
replica's batch into micro-batches run one after another before the one
update. The base learning rate is given at batch 128 and scales linearly
with the batch of one update (Goyal et al., 2017), so `--batch_size=1024`
on 8 replicas trains like the paper's 128 on one.

Every distributor makes its plan once it knows its replicas
(`distribute.base.Distributor.batch`), and the builders, the training loop,
the evaluation and `--dry_run` read it: no other module multiplies or
divides a batch. Free of TensorFlow, so `--dry_run` makes the same plan
from the replicas start-up tells it, without a distributor.
"""

import dataclasses

from tf_resnet.errors import UserInputError

REFERENCE_BATCH = 128


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """The examples of a step, a replica, an update, and the peak rate.

    Attributes:
      distribution: the engine's `--distribution` value (for messages).
      global_batch: `--batch_size`, examples of one step over all replicas
        of all workers.
      replicas: replicas the global batch is split over.
      replicas_per_update: replicas whose gradients make one update.
      replica_batch: examples of one replica's step.
      update_batch: examples of one optimizer update; losses are divided
        by it, so the combined gradient is the mean over them.
      accumulate_steps: `--accumulate_steps`, micro-batches of one update.
      eval_batch: examples of one evaluation batch of each process
        (`--eval_batch_size`, else the global batch).
      base_learning_rate: `--learning_rate`, the rate at batch 128.
      peak_learning_rate: the base rate scaled to `update_batch`: the
        schedule's peak.
    """

    distribution: str
    global_batch: int
    replicas: int
    replicas_per_update: int
    replica_batch: int
    update_batch: int
    accumulate_steps: int
    eval_batch: int
    base_learning_rate: float
    peak_learning_rate: float

    @property
    def micro_batch(self):
        """Examples of one micro-batch: a replica's batch split evenly.

        Asked by training and `--dry_run`, not when the plan is made: an
        evaluation job carries the run's `--accumulate_steps` and never
        splits its batch.

        Raises:
          UserInputError: the replica's batch does not split into
            `accumulate_steps` equal parts.
        """
        if self.replica_batch % self.accumulate_steps:
            raise UserInputError(
                f"--accumulate_steps={self.accumulate_steps} does not split "
                f"the {self.replica_batch} examples of each replica's batch "
                "(--batch_size over the replicas) into equal micro-batches"
            )
        return self.replica_batch // self.accumulate_steps

    def describe_micro_batches(self):
        """What the start line and `--dry_run` add for `--accumulate_steps`.

        Raises:
          UserInputError: as `micro_batch`.
        """
        if self.accumulate_steps == 1:
            return ""
        return (
            f", each replica's batch in {self.accumulate_steps} "
            f"micro-batches of {self.micro_batch}"
        )

    def steps_per_epoch(self, num_examples):
        """Steps of one pass over `num_examples`, at least one.

        The rest of an epoch that fills no global batch is left to the next.
        """
        return max(1, num_examples // self.global_batch)

    def examples(self, steps):
        """Examples that `steps` steps read over all replicas."""
        return steps * self.global_batch


def plan(optim, replicas, replicas_per_update, distribution):
    """The batch plan of `optim` on `replicas`, made once per process.

    Args:
      optim: the `settings.OptimConfig` (`batch_size`, `accumulate_steps`,
        `eval_batch_size`, `learning_rate`).
      replicas: replicas the global batch is split over.
      replicas_per_update: replicas whose gradients make one update.
      distribution: the engine's name, for the error.

    Raises:
      UserInputError: the global batch does not split into `replicas`
        equal parts.
    """
    global_batch = optim.batch_size
    if global_batch % replicas:
        raise UserInputError(
            f"--batch_size={global_batch} is not divisible by the "
            f"{replicas} replicas of --distribution={distribution}"
        )
    replica_batch = global_batch // replicas
    update_batch = replica_batch * replicas_per_update
    return BatchPlan(
        distribution=distribution,
        global_batch=global_batch,
        replicas=replicas,
        replicas_per_update=replicas_per_update,
        replica_batch=replica_batch,
        update_batch=update_batch,
        accumulate_steps=optim.accumulate_steps,
        eval_batch=optim.eval_batch_size or global_batch,
        base_learning_rate=optim.learning_rate,
        peak_learning_rate=(
            optim.learning_rate * update_batch / REFERENCE_BATCH
        ),
    )

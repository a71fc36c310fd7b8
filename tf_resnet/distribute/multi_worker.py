"""Synchronous all-reduce over processes (`--distribution=multi_worker`).

TensorFlow's own `tf.distribute.MultiWorkerMirroredStrategy`: one process
("worker") per machine, one replica per GPU of it (one on a CPU-only
worker). Every step all-reduces the gradients of all replicas of all
workers, so every worker applies the same update.

The cluster comes from, in this order: `--worker_hosts` with
`--task_index` (worker 0 is the chief), `TF_CONFIG`, or the variables of
a Slurm job step (`SlurmClusterResolver`). `python -m
tf_resnet.launch.tf_config_cluster --np=N` starts N workers on this machine.

The gradient all-reduce is the Keras optimizer's, over the strategy's
replicas, in packs of `CommunicationOptions`' `bytes_per_pack`: TensorFlow
packs the gradients in reverse order, the last layer's first, and each
pack's collective runs once its own gradients exist, so the packs are the
overlapped all-reduce's buckets (`buckets.plan` makes the same ones; a
profile of a step shows the overlap: `tests/test_overlap.py`). Their size
is `--all_reduce_pack_bytes` or the buckets' default;
`--nooverlap_all_reduce` makes it one pack, all-reduced after the backward
pass. `--gradient_compression=fp16` runs it on float16 copies
(`tf_strategy.all_reduce_in_float16`).

Consistency of the state: variables are mirrored (`ON_WRITE`) on every
worker. Trainable weights get the same all-reduced update everywhere. The
BatchNorm moving statistics do not: Keras 3 creates them without an
aggregation, so each worker's copy follows its own batches and the
copies drift apart. `synchronize` replaces them by their mean over the
workers in one all-reduce before every evaluation and checkpoint, as the
Horovod mode does, so the workers evaluate and save one model.
(`--sync_bn` normalises each batch with statistics of the whole global
batch, which is another matter.)

The same cluster also runs `--distribution=averaging`
(`MultiWorkerAveragingDistributor`): there the strategy only lends its
collectives (`Collectives`) and each worker trains its own, unmirrored model.

A lost peer must make the others fail, not hang: a dead one resets its
connections, so the next all-reduce fails; a frozen one stops answering
TensorFlow's coordination service (apparently what aborts the collectives
then: docs/distributed.md); and every collective gets
`--peer_timeout_secs` (`CommunicationOptions`) for a peer that is alive
but never reaches it, the bound the training loop also keeps on the
time between two steps (`peer_watch`).
"""

import tempfile

import tensorflow as tf

from tf_resnet import detect, traffic
from tf_resnet.distribute import averaging, base, buckets, tf_strategy
from tf_resnet.errors import UserInputError

# What collectives all-reduce exactly; other variables (RNG states) stay.
_REDUCIBLE = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int64)


def cluster_resolver(worker_hosts=(), task_index=0, slurm_port=None):
    """The cluster from `--worker_hosts`, else `TF_CONFIG`, else Slurm.

    Args:
      worker_hosts: `host:port` of each worker, the chief first.
      task_index: this worker's index in `worker_hosts`.
      slurm_port: the first port of a Slurm node's workers (default: the
        job's own, `detect.slurm_job_port`).

    Returns:
      A `tf.distribute.cluster_resolver.ClusterResolver`.

    Raises:
      UserInputError: no cluster is given, it has parameter servers, or
        this task is not part of it.
    """
    if worker_hosts:
        if not 0 <= task_index < len(worker_hosts):
            raise UserInputError(
                f"--task_index={task_index} is not in --worker_hosts, which "
                f"names {len(worker_hosts)} worker(s)"
            )
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": list(worker_hosts)}),
            task_type="worker",
            task_id=task_index,
            rpc_layer="grpc",
        )
    tf_config = detect.read_tf_config()
    if tf_config:
        cluster = tf_config.get("cluster", {})
        if "ps" in cluster or not (cluster.get("worker") or "chief" in cluster):
            raise UserInputError(
                "TF_CONFIG: --distribution=multi_worker needs a cluster of "
                f"workers (optionally a chief) and no ps: {cluster}"
            )
        task = tf_config.get("task", {})
        tasks = cluster.get(task.get("type"), [])
        if not 0 <= task.get("index", 0) < len(tasks):
            raise UserInputError(
                f"TF_CONFIG: task {task} is not in the cluster {cluster}"
            )
        return tf.distribute.cluster_resolver.TFConfigClusterResolver(
            rpc_layer="grpc"
        )
    if detect.in_slurm_task():
        return _slurm_resolver(slurm_port or detect.slurm_job_port())
    raise UserInputError(
        "--distribution=multi_worker needs a cluster: --worker_hosts with "
        "--task_index, a TF_CONFIG environment variable, a Slurm job step "
        "(srun), or `python -m tf_resnet.launch.tf_config_cluster` (see "
        "docs/distributed.md)"
    )


def _slurm_resolver(port):
    """One worker per Slurm task; the resolver places no GPU.

    `SlurmClusterResolver` would number a node's tasks by its GPUs (asking
    `nvidia-smi`) and set `CUDA_VISIBLE_DEVICES`; the devices are the
    device plan's (`devices.plan`, by `SLURM_LOCALID`), so it is given one
    slot per task and told not to.
    """
    slots = detect.slurm_step_slots()
    return tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port, gpus_per_node=slots, gpus_per_task=1, auto_set_gpu=False
    )


def make_strategy(resolver, timeout_secs, pack_bytes=0):
    """The strategy; must come before any other TensorFlow op runs.

    MWMS starts this process's gRPC server and sets up the collective
    runtime when it is created, which TensorFlow refuses once its context
    is initialised.

    Args:
      resolver: the cluster (`cluster_resolver`).
      timeout_secs: `--peer_timeout_secs`, of every collective.
      pack_bytes: `--all_reduce_pack_bytes`: the gradient all-reduce is
        split into packs of about this size (0: TensorFlow's default).
    """
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver,
        communication_options=tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=pack_bytes, timeout_seconds=timeout_secs
        ),
    )


class Collectives:
    """All-reduces over the workers of a MWMS cluster, one value per worker.

    Used by the synchronous mode for what crosses workers outside the
    gradient all-reduce, and by the averaging mode for everything (its
    model lives outside the strategy).

    Attributes:
      num_workers: processes of the cluster.
      worker_index: this process's index; 0 is the chief.
    """

    def __init__(self, strategy):
        self.strategy = strategy
        resolver = strategy.cluster_resolver
        spec = resolver.cluster_spec()
        self.num_workers = spec.num_tasks("worker") + (
            spec.num_tasks("chief") if "chief" in spec.jobs else 0
        )
        self.worker_index = _worker_index(resolver)
        self._sum_flag = None

    def peers(self):
        """The other workers and their addresses, the chief's first."""
        spec = self.strategy.cluster_resolver.cluster_spec().as_dict()
        places = [*spec.get("chief", []), *spec.get("worker", [])]
        return base.name_peers("worker", self.worker_index, places)

    def sum(self, value):
        """The sum over workers of `value`, given by one replica of each."""
        local = len(self.strategy.extended.worker_devices)

        def first_local_replica(context):
            first = context.replica_id_in_sync_group % local == 0
            return value if first else tf.zeros_like(value)

        distribute = self.strategy.experimental_distribute_values_from_function
        per_replica = distribute(first_local_replica)
        return self.strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica, axis=None
        )

    def any_true(self, flag):
        """Whether `flag` is true on any worker: one scalar all-reduce.

        Compiled once: run eagerly, the same all-reduce took about twice as
        long.
        """
        if self._sum_flag is None:
            self._sum_flag = tf.function(self.sum, autograph=False)
        value = tf.constant([1.0 if flag else 0.0], tf.float32)
        return bool(self._sum_flag(value).numpy()[0] > 0)

    def broadcast_from_chief(self, variables):
        """Assigns the chief's value to each (reducible) variable."""
        is_chief = self.worker_index == 0
        for variable in variables:
            if variable.dtype not in _REDUCIBLE:
                continue
            value = tf.convert_to_tensor(variable)
            chief = tf.where(is_chief, value, tf.zeros_like(value))
            variable.assign(self.sum(chief))

    def average_in_place(self, variables):
        """Replaces each floating-point variable by its mean over workers.

        One all-reduce of all of them, flattened into one float64 vector.
        """
        variables = [v for v in variables if v.dtype in _REDUCIBLE[:4]]
        if not variables:
            return
        flat = tf.concat(
            [tf.reshape(tf.cast(v, tf.float64), [-1]) for v in variables], 0
        )
        mean = self.sum(flat) / self.num_workers
        sizes = [int(tf.size(v)) for v in variables]
        for variable, part in zip(
            variables, tf.split(mean, sizes), strict=True
        ):
            variable.assign(
                tf.cast(tf.reshape(part, variable.shape), variable.dtype)
            )


class MultiWorkerDistributor(tf_strategy.StrategyDistributor):
    """Synchronous SGD over the replicas of all workers.

    Attributes:
      num_workers: processes of the cluster.
      worker_index: this process's index; 0 is the chief.
    """

    stop_check_every_steps = base.PEERS_STOP_CHECK_EVERY_STEPS

    def __init__(self, strategy, optim, compression="none", bucket_bytes=0):
        """A worker of the cluster of `strategy`.

        Args:
          strategy: its `MultiWorkerMirroredStrategy` (`make_strategy`).
          optim: the `settings.OptimConfig`: its batch is split over all
            replicas (`base.Distributor.batch`).
          compression: `--gradient_compression`.
          bucket_bytes: the strategy's `bytes_per_pack`, for the start
            line (0: one pack).
        """
        self.collectives = Collectives(strategy)
        self.num_workers = self.collectives.num_workers
        self.worker_index = self.collectives.worker_index
        self.is_chief = self.worker_index == 0
        self.bucket_bytes = bucket_bytes
        super().__init__(strategy, "multi_worker", optim, compression)

    def describe_all_reduce(self, variables, xla=False):
        """The gradient all-reduce, for the start line."""
        if not self.bucket_bytes:
            return "one pack after the backward pass"
        return buckets.describe(variables, self.bucket_bytes, xla)

    def distribute_dataset(self, dataset_fn):
        """Each worker reads its own shard: `distribute_datasets_from_function`.

        Not `experimental_distribute_dataset`, which would have every worker
        read and augment the whole global batch and keep its slice: here
        each worker's pipeline reads shard `input_pipeline_id` of
        `num_input_pipelines` (one per worker) in batches of one replica,
        so no example is read twice in a step. As with Horovod, the shards
        are strides of one permutation per epoch (`data.pipeline`), so a
        step covers the same examples as one process's global batch.
        """

        def input_fn(context):
            return dataset_fn(
                context.num_input_pipelines,
                context.input_pipeline_id,
                self.batch.replica_batch,
            )

        return iter(self.strategy.distribute_datasets_from_function(input_fn))

    def reduce_sum(self, per_replica_value):
        """Step metrics of all workers, so every worker logs the global loss.

        One reduce per metric: MWMS' `reduce` takes no dict in a function.
        """
        return {
            key: self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, None)
            for key, value in per_replica_value.items()
        }

    def eval_shard(self):
        """Every worker evaluates its shard; `all_reduce_sum` adds counts."""
        return self.num_workers, self.worker_index

    def all_reduce_sum(self, values):
        """Sums numpy values over workers with one collective all-reduce."""
        return self.collectives.sum(tf.constant(values)).numpy()

    def broadcast_initial_state(self, state):
        """The chief's state wins, restored or fresh.

        MWMS broadcasts each variable's initial value from the chief, but a
        restore assigns what each worker read itself; a worker that did not
        see the chief's checkpoint (no shared `--log_root`) would otherwise
        train on from its own start.
        """
        self.collectives.broadcast_from_chief(state.variables)

    def synchronize(self, state):
        """Averages the BN moving statistics (and their EMA) over workers."""
        self.collectives.average_in_place(state.local_variables)

    def any_process_stopping(self, stopping):
        """Whether any worker got a stop signal: all then stop together."""
        return self.collectives.any_true(stopping)

    def peers(self):
        return self.collectives.peers()

    def end_of_run(self):
        """Waits until every worker has released its input iterator.

        A worker deleting its iterator after a peer has exited waits for
        the coordination service to declare the peer dead (10 s) and logs
        its heartbeat errors; one all-reduce here keeps all of them alive
        until each is done.
        """
        self.collectives.sum(tf.zeros([1]))

    def checkpoint_dir(self, log_root):
        """The chief writes `log_root`; the others a directory to discard.

        Every worker must take part in a MWMS save (it may run collectives),
        but only the chief's copy is kept.
        """
        if self.is_chief:
            return log_root
        return tempfile.mkdtemp(prefix=f"tf_resnet_worker{self.worker_index}_")

    def shutdown(self):
        """Nothing to release: the servers end with the process."""


class MultiWorkerAveragingDistributor(averaging.LocalSteps, base.Distributor):
    """`--distribution=averaging` on the workers of a cluster.

    The model, optimizer and input pipeline are this process's own, under
    the default strategy, as in a single-process run: mirrored MWMS
    variables would get the same all-reduced update on every worker each
    step, while here each worker must train its own weights between
    averages. The strategy serves only for its collectives: the initial
    broadcast, step metrics, evaluation counts and the averages.
    """

    stop_check_every_steps = base.PEERS_STOP_CHECK_EVERY_STEPS

    def __init__(self, strategy, optim, average_every):
        self.collectives = Collectives(strategy)
        self.num_replicas = self.collectives.num_workers
        self.worker_index = self.collectives.worker_index
        self.is_chief = self.worker_index == 0
        super().__init__(optim, average_every)

    def distribute_dataset(self, dataset_fn):
        """Each worker reads its own shard, as a Horovod rank does."""
        return iter(
            dataset_fn(
                self.num_replicas, self.worker_index, self.batch.replica_batch
            )
        )

    def eval_shard(self):
        """Every worker evaluates its shard; `all_reduce_sum` adds counts."""
        return self.num_replicas, self.worker_index

    def reduce_sum(self, per_replica_value):
        """Step metrics of all workers, so every worker logs the global loss."""
        return {
            key: self.collectives.sum(value)
            for key, value in per_replica_value.items()
        }

    def all_reduce_sum(self, values):
        """Sums numpy values over workers with one collective all-reduce."""
        return self.collectives.sum(tf.constant(values)).numpy()

    def broadcast_initial_state(self, state):
        """The chief's state wins, restored or fresh (nothing is mirrored)."""
        self.collectives.broadcast_from_chief(state.variables)

    def average_in_place(self, variables):
        """One collective all-reduce of all of them."""
        self.collectives.average_in_place(variables)

    def any_process_stopping(self, stopping):
        """Whether any worker got a stop signal: all then stop together."""
        return self.collectives.any_true(stopping)

    def peers(self):
        return self.collectives.peers()

    def end_of_run(self):
        """As `MultiWorkerDistributor.end_of_run`: no worker leaves first."""
        self.collectives.sum(tf.zeros([1]))


def _worker_index(resolver):
    """Index among all workers, the chief (if a job of its own) first."""
    spec = resolver.cluster_spec()
    if resolver.task_type == "chief":
        return 0
    offset = 1 if "chief" in spec.jobs else 0
    return offset + (resolver.task_id or 0)


def make_distributor(optim, config, devices):
    """The distributor of `settings.DistributionConfig`; the first TF work."""
    del devices  # The strategy takes this worker's GPUs, or its CPU.
    resolver = cluster_resolver(config.worker_hosts, config.task_index)
    packs = (
        traffic.bucket_bytes(config.all_reduce_pack_bytes)
        if config.overlap_all_reduce
        else 0
    )
    strategy = make_strategy(resolver, config.peer_timeout_secs, packs)
    return MultiWorkerDistributor(
        strategy, optim, config.gradient_compression, packs
    )


def make_averaging_distributor(optim, config, devices):
    """`--distribution=averaging` in this cluster; first TF work of the run.

    One device per worker: the local rank's GPU (`devices.plan`).
    """
    del devices
    resolver = cluster_resolver(config.worker_hosts, config.task_index)
    strategy = make_strategy(resolver, config.peer_timeout_secs)
    return MultiWorkerAveragingDistributor(
        strategy, optim, config.average_every
    )

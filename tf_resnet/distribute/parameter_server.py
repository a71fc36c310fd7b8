"""Asynchronous SGD with parameter servers (`--distribution=parameter_server`).

TensorFlow's own `tf.distribute.ParameterServerStrategy` and
`tf.distribute.coordinator.ClusterCoordinator`: variables (weights, BatchNorm
statistics, momentum slots, the step counter) live on the `ps` tasks; this
process is the coordinator (job `chief`), which schedules training steps
onto whichever `worker` is free. Each step reads the variables, computes the
gradient of one batch on the worker and applies it on the ps without waiting
for the other workers, so a slow worker does not hold the fast ones back.

One step of the training loop is one optimizer update of `--batch_size`
examples, as in TensorFlow's own convention for this strategy (a CPU worker
is one replica, so `num_replicas_in_sync == 1`). `--train_steps`, epochs,
images/sec and the learning-rate scaling therefore mean what they mean in
every other mode; more workers make the steps finish sooner.

The `ps` and `worker` tasks are plain servers: `resnet_main.py
--job_name=ps|worker` (or a `TF_CONFIG` naming that task) runs
`run_server`, which serves until its process ends: killed, or, when no
data has reached it for `--peer_timeout_secs` (its coordinator gone, cut
off or frozen), by `peer_watch` with exit code 4. They must be separate
processes (a cluster of in-process servers hangs). `python -m
tf_resnet.launch.ps` starts a whole cluster on one machine.
"""

import functools
import os

import numpy as np
import tensorflow as tf
from absl import logging

from tf_resnet import peer_watch
from tf_resnet.detect import SERVER_JOBS, is_server_task, read_tf_config
from tf_resnet.distribute import base
from tf_resnet.errors import UserInputError

# Inside a function run on a worker: that worker's index (int64 tensor).
current_worker_index = (
    tf.distribute.coordinator.experimental_get_current_worker_index
)


def cluster_resolver(ps_hosts=(), worker_hosts=(), job_name="", task_index=0):
    """The cluster from `--ps_hosts --worker_hosts`, else from `TF_CONFIG`.

    Args:
      ps_hosts: `host:port` of each parameter server.
      worker_hosts: `host:port` of each worker.
      job_name: this process's job: `ps`, `worker`, or `chief`/empty for the
        coordinator.
      task_index: index of this process within its job.

    Returns:
      A `tf.distribute.cluster_resolver.ClusterResolver`.

    Raises:
      UserInputError: no cluster is given, or it lacks ps or workers, or the
        task is not part of it.
    """
    if ps_hosts or worker_hosts:
        if not (ps_hosts and worker_hosts):
            raise UserInputError(
                "--ps_hosts and --worker_hosts must be given together "
                f"(got ps_hosts={list(ps_hosts)}, "
                f"worker_hosts={list(worker_hosts)})"
            )
        spec = {"ps": list(ps_hosts), "worker": list(worker_hosts)}
        job_name = job_name or "chief"
        if job_name in SERVER_JOBS:
            _check_task(spec, job_name, task_index, "--task_index")
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec),
            # The coordinator is not in the flags' cluster: TensorFlow adds
            # a `chief` job on a free port of this host when it connects.
            task_type=job_name if job_name in SERVER_JOBS else None,
            task_id=task_index,
            rpc_layer="grpc",
        )
    config = read_tf_config()
    if not config:
        raise UserInputError(
            "--distribution=parameter_server needs a cluster: --ps_hosts and "
            "--worker_hosts, or a TF_CONFIG environment variable (see "
            "docs/parameter_server.md), or run it through "
            "`python -m tf_resnet.launch.ps`"
        )
    cluster = config.get("cluster", {})
    for job in SERVER_JOBS:
        if not cluster.get(job):
            raise UserInputError(
                f"TF_CONFIG: the cluster has no {job!r} job; parameter-server "
                f"training needs at least one ps and one worker: {cluster}"
            )
    task = config.get("task", {})
    if task.get("type") in SERVER_JOBS:
        _check_task(cluster, task["type"], task.get("index", 0), "TF_CONFIG")
    return tf.distribute.cluster_resolver.TFConfigClusterResolver(
        rpc_layer="grpc"
    )


def _check_task(cluster, job_name, task_index, source):
    if not 0 <= task_index < len(cluster[job_name]):
        raise UserInputError(
            f"{source}: task {task_index} of job {job_name!r} is not in the "
            f"cluster, which has {len(cluster[job_name])} {job_name} task(s)"
        )


def server_task(ps_hosts=(), worker_hosts=(), job_name="", task_index=0):
    """The resolver of this process if it is a ps or worker task, else None.

    Which processes are tasks is `detect.is_server_task` (`--job_name=ps|
    worker`, or a `TF_CONFIG` naming such a task of a cluster with ps);
    this adds the checks of the flags that name one.
    """
    if job_name and job_name not in (*SERVER_JOBS, "chief"):
        raise UserInputError(
            f"--job_name={job_name}: expected ps, worker or chief"
        )
    if not is_server_task(job_name):
        return None
    if not job_name:
        return cluster_resolver()
    if not (ps_hosts and worker_hosts):
        raise UserInputError(
            f"--job_name={job_name} needs --ps_hosts and --worker_hosts"
        )
    return cluster_resolver(ps_hosts, worker_hosts, job_name, task_index)


def run_server(resolver, bound_secs, log_root):
    """Serves this ps or worker task until its coordinator is gone.

    Args:
      resolver: this task's cluster resolver (`server_task`).
      bound_secs: `--peer_timeout_secs`: with no data received for that
        long, the process ends with the lost-peer line and exit code 4
        (`peer_watch.watch_traffic`), instead of serving until killed.
      log_root: the run directory, for the line's checkpoint.
    """
    # TensorFlow's recommendation for ps/worker tasks: let the caller (the
    # coordinator) decide how to handle an unreachable peer, so it can wait
    # for a restarted worker instead of the worker giving up.
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    logging.info(
        "%s task %d serving at %s",
        resolver.task_type,
        resolver.task_id,
        server.target,
    )
    with peer_watch.PeerWatch(
        bound_secs,
        "the coordinator",
        log_root,
        silence="no data from the coordinator or another task",
    ) as watch:
        peer_watch.watch_traffic(watch)
        server.join()


def serve(dist, log_root):
    """Serves if this process is a ps or worker task (`run_server`).

    Args:
      dist: the `settings.DistributionConfig`.
      log_root: the run directory (`--log_root`).

    Returns:
      False for the coordinator (and any process outside a ps cluster).
    """
    resolver = server_task(**dist.cluster)
    if resolver is None:
        return False
    run_server(resolver, dist.peer_timeout_secs, log_root)
    return True


def make_distributor(optim, dist, devices):
    """The coordinator's mode; the cluster decides the devices."""
    del devices
    return ParameterServerDistributor(cluster_resolver(**dist.cluster), optim)


class ParameterServerDistributor(base.Distributor):
    """Coordinator of asynchronous parameter-server training.

    Attributes:
      strategy: the `tf.distribute.ParameterServerStrategy`.
      coordinator: its `tf.distribute.coordinator.ClusterCoordinator`.
      num_workers: worker tasks steps are scheduled on.
    """

    name = "parameter_server"
    is_chief = True

    def __init__(self, resolver, optim):
        self.strategy = tf.distribute.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(
            self.strategy
        )
        self.num_workers = resolver.cluster_spec().num_tasks("worker")
        self._cluster = resolver.cluster_spec().as_dict()
        # Replicas of ONE worker (its GPUs) are synchronous; workers are not.
        self.num_replicas = self.strategy.num_replicas_in_sync
        self._worker_steps = None
        super().__init__(optim)

    def scope(self):
        return self.strategy.scope()

    def distribute_dataset(self, dataset_fn):
        """One input pipeline per worker, reading shard `worker_index`.

        The dataset function is traced once and run on every worker, so the
        shard is chosen inside the graph from the index of the worker it runs
        on; otherwise every worker would train on the same seeded stream.
        """
        num_workers = self.num_workers

        def input_fn(context):
            batch = context.get_per_replica_batch_size(self.batch.global_batch)
            shards = [
                functools.partial(dataset_fn, num_workers, index, batch)
                for index in range(num_workers)
            ]
            if num_workers == 1:
                return shards[0]()
            worker = current_worker_index()
            return tf.switch_case(tf.cast(worker, tf.int32), shards)

        @tf.function(autograph=False)
        def per_worker_dataset_fn():
            return self.strategy.distribute_datasets_from_function(input_fn)

        dataset = self.coordinator.create_per_worker_dataset(
            per_worker_dataset_fn
        )
        return iter(dataset)

    def prepare_optimizer(self, optimizer):
        """Makes the optimizer's step counter one `assign_add` op.

        Keras 3 increments `iterations` as `assign(iterations + 1)`, a read
        and then a write. Under asynchronous training two workers read the
        same value and a step is lost, which slows the learning-rate
        schedule and makes a resumed run restart from an earlier step than
        its checkpoint's (docs/parameter_server.md). The `tf.Variable`'s own
        `assign_add` runs as one op on the parameter server; Keras' TF
        optimizer already updates the weights that way.
        """
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        counter = inner.iterations
        counter.assign_add = functools.partial(inner.assign_add, counter)

    def make_train_step(self, replica_fn):
        """Scheduling a step returns at once with a `RemoteValue`."""
        if self._worker_steps is None:  # The loop may re-trace the step.
            with self.strategy.scope():
                self._worker_steps = tf.Variable(
                    tf.zeros([self.num_workers], tf.int64),
                    trainable=False,
                    name="steps_per_worker",
                )
        worker_steps = self._worker_steps

        @tf.function(autograph=False)
        def worker_step(iterator):
            worker = current_worker_index()
            worker_steps.assign_add(
                tf.one_hot(worker, self.num_workers, dtype=tf.int64)
            )
            per_replica = self.strategy.run(replica_fn, args=next(iterator))
            return self.strategy.reduce(
                tf.distribute.ReduceOp.SUM, per_replica, axis=None
            )

        def train_step(iterator):
            return self.coordinator.schedule(worker_step, args=(iterator,))

        return train_step

    def fetch(self, value):
        return self.coordinator.fetch(value)

    def synchronize(self, state):
        """Waits for every scheduled step before evaluating or saving."""
        del state
        self.coordinator.join()

    def peers(self):
        """The parameter servers and workers, with their addresses."""
        return ", ".join(
            base.name_peers(job, -1, self._cluster.get(job, []))
            for job in ("ps", "worker")
        )

    def steps_per_worker(self):
        """Training steps each worker has run so far (numpy int64 array)."""
        if self._worker_steps is None:
            return np.zeros([self.num_workers], np.int64)
        self.coordinator.join()
        return self._worker_steps.numpy()

    def shutdown(self):
        """Logs the work split; the ps/worker servers are left to their owner.

        TensorFlow servers cannot be stopped remotely: `tf_resnet.launch.ps`
        (or the cluster's job manager) ends them when the coordinator exits.
        """
        try:
            logging.info(
                "steps run per worker: %s", self.steps_per_worker().tolist()
            )
        except tf.errors.OpError as error:
            logging.warning("could not read the steps per worker: %s", error)

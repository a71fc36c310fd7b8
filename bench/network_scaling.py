"""Scaling across an emulated network: every engine on 1 node and on 2.

  .venv/bin/python bench/network_scaling.py --out=runs/network_scaling.json

(as root: it makes network namespaces; `apt-get install iperf3` first.)

Nodes are network namespaces on a bridge whose links are rate-shaped in
both directions (`emulated_cluster`); each process of a job runs in its
node's namespace, pinned to its own core, so "2 nodes" is one worker per
node, one core each. Everything else is the project's own: each process
runs the training step of its engine's `Distributor` (the loop's
`make_replica_fn`, the mode's all-reduce) on a fixed batch, started the
way that engine's processes are (Horovod's Gloo rendezvous and
`HOROVOD_*` variables as `horovodrun` sets them; `TF_CONFIG` for
multi_worker; ps and worker servers of `resnet_main.py --job_name` and a
coordinator for parameter_server).

The network stands for a real one seen from a GPU: a 2-core CPU step is
far slower than a GPU step, so the link is slowed by the same factor,
`s = CPU step / GPU step` (the GPU step times are named in
`tf_resnet.scaling.GPU_STEPS`), which keeps the compute-to-communication
ratio the GPU's. `s` is measured per model from its 1-node step.

Per model it prints, and writes to `--out`:
  * the shaped link checked with iperf3 (TCP goodput against the rate);
  * the all-reduce time against message size on 2 and 4 processes, per
    transport (Horovod's Gloo, TensorFlow's collectives), and the ring
    model `c + 2(p-1)a + 2(p-1)/p n/B` fitted to it;
  * the step time of each engine on 1 node and on 2, beside what the
    model predicts for the 2-node step from the 1-node step and the fit
    (`tf_resnet.scaling.predict_two_nodes`), and the error.
"""

import argparse
import dataclasses
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import emulated_cluster  # noqa: E402

from tf_resnet import scaling, traffic  # noqa: E402
from tf_resnet.config import engines  # noqa: E402

RESULT = "NETWORK_SCALING_RESULT "
# The links' rate where a job's step is to hold no network time, Mbit/s.
UNSHAPED_MBIT = 100_000
UNSHAPED = "unshaped"  # `--network`: links at that rate.
PYTHON = sys.executable
HERE = os.path.abspath(__file__)
MAIN = os.path.join(common.ROOT, "resnet_main.py")
# What each model trains on here: CIFAR models on CIFAR's 32x32 images,
# the ImageNet layout on TinyImageNet's 64x64 with ImageNet's 1000
# classes (the real gradient size).
SHAPES = {"cifar": (32, 10), "imagenet": (64, 1000)}


def model_shape(model):
    family = "imagenet" if model in scaling.IMAGENET_MODELS else "cifar"
    return SHAPES[family]


# --- inside a node --------------------------------------------------------


def cpu_seconds(sessions):
    """CPU time (user + system) of every process of each session, seconds.

    `sessions`: `{name: session id}`. Each process `EmulatedCluster.spawn`
    starts leads a session of its own, so its session holds it with every
    thread and child. Read from /proc: the processes of a job live in other
    network namespaces, not other PID ones.
    """
    names = {sid: name for name, sid in sessions.items()}
    totals = dict.fromkeys(sessions, 0.0)
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stream:
                # After the command's closing parenthesis: state, ppid,
                # pgrp, session, ..., utime and stime (fields 14, 15).
                fields = stream.read().rsplit(")", 1)[1].split()
        except OSError:  # Ended since the listing.
            continue
        name = names.get(int(fields[3]))
        if name is not None:
            totals[name] += (int(fields[11]) + int(fields[12])) / tick
    return totals


def run_worker(spec):
    """One process of a job: time steps (and all-reduces); rank 0 reports."""
    if spec.get("script") == "tape":
        return run_tape_script(spec)
    import numpy as np
    import tensorflow as tf

    from tf_resnet import builders, train_loop
    from tf_resnet.config.settings import make_config
    from tf_resnet.distribute.averaging import float_variables
    from tf_resnet.distribute.base import TrainState

    size, classes = model_shape(spec["model"])
    ps = spec["flags"]["distribution"] == "parameter_server"
    config = make_config(
        train_data_path=common.DATA["cifar10"]["path"],
        model=spec["model"],
        batch_size=spec["global_batch"],
        intra_op_threads=1,
        inter_op_threads=2 if ps else spec.get("inter_op_threads", 1),
        dtype="float32",
        **spec["flags"],
    )
    mode = common.start_mode(config)
    info = types.SimpleNamespace(num_classes=classes, image_size=size)
    model = builders.build_model(config, mode, info)
    optimizer = builders.build_optimizer(
        config, mode, model, total_steps=100_000
    )
    state = TrainState(model, optimizer)
    mode.broadcast_initial_state(state)
    step_fn = mode.make_train_step(
        train_loop.make_replica_fn(model, optimizer, mode, config)
    )
    rng = np.random.default_rng(0)
    batch = (
        rng.normal(size=(mode.replica_batch, size, size, 3)).astype("float32"),
        rng.integers(0, classes, size=mode.replica_batch).astype("int32"),
    )
    iterator = mode.distribute_dataset(
        lambda *_: tf.data.Dataset.from_tensors(batch).repeat()
    )
    coordinator = getattr(mode, "coordinator", None)  # parameter_server
    step = 0

    each_step = []  # Of the timed blocks: a synchronous step's spread.

    def block(steps):
        nonlocal step
        start = time.perf_counter()
        for _ in range(steps):
            began = time.perf_counter()
            metrics = step_fn(iterator)
            step += 1
            mode.after_step(step, state)  # averaging: every k steps
            each_step.append(time.perf_counter() - began)
        mode.fetch(metrics)
        if coordinator is not None:
            coordinator.join()
        return time.perf_counter() - start

    start = time.perf_counter()
    block(spec["warmup_steps"])
    warmup = time.perf_counter() - start
    each_step.clear()
    # parameter_server's jobs: the CPU time over the timed blocks of its
    # ps and worker servers (`cpu_of`) and of this process, the chief
    # (its coordinator).
    sessions = spec.get("cpu_of")
    if sessions:
        sessions = {**sessions, "chief": os.getsid(0)}
        cpu_before = cpu_seconds(sessions)
    process_cpu = time.process_time()
    seconds = [block(spec["steps"]) for _ in range(spec["blocks"])]
    process_cpu = time.process_time() - process_cpu
    if sessions:
        cpu_after = cpu_seconds(sessions)
    result = {
        "step_s": [s / spec["steps"] for s in seconds],
        # This process's CPU time per step, every thread of it.
        "process_cpu_s": process_cpu / (spec["steps"] * spec["blocks"]),
        "each_step_s": each_step,
        "warmup_s": warmup,
        # What the process ran with (parameter_server's: always 2; 0, the
        # default, as `runtime.start` resolved it).
        "inter_op_threads": (
            tf.config.threading.get_inter_op_parallelism_threads()
        ),
        "tensors": len(model.trainable_variables),
        "gradient_bytes": sum(
            int(np.prod(v.shape)) * 4 for v in model.trainable_variables
        ),
        "state_bytes": sum(
            int(np.prod(v.shape)) * 4
            for v in state.variables
            if v.dtype in ("float32",)
        ),
    }
    if sessions:
        result["cpu_s"] = {
            name: (cpu_after[name] - cpu_before[name])
            / (spec["steps"] * spec["blocks"])
            for name in sessions
        }
    if hasattr(mode, "average_in_place"):
        # The averaging engine's own all-reduce (weights, statistics and
        # slots, as `after_step` does), timed alone: what the model's
        # all-reduce of its bytes stands for.
        variables = float_variables(state.variables)
        result["average_s"] = []
        for _ in range(3):
            start = time.perf_counter()
            mode.average_in_place(variables)
            result["average_s"].append(time.perf_counter() - start)
    if spec.get("communication_alone"):
        result["communication_s"] = communication_alone(mode, model)
        if getattr(mode, "strategy", None) is None:  # Horovod
            result["compute_s"] = compute_alone(
                mode, model, optimizer, config, iterator, spec
            )
    if spec.get("sweep"):
        fp16 = spec["flags"].get("gradient_compression") == "fp16"
        result["sweep"] = sweep(
            mode, spec["sweep"], spec["sweep_repeats"], fp16
        )
    if mode.is_chief:
        print(RESULT + json.dumps(result), flush=True)
    mode.shutdown()


def run_tape_script(spec):
    """A plain Horovod TF2 script's step: the anchor of the overlap rows.

    What a user writes from Horovod's TensorFlow 2 example, not the
    engine: the same model (`models.build_model`), batch and threads, a
    `tf.function` step whose `hvd.DistributedGradientTape` all-reduces
    each gradient (its default: one all-reduce per tensor, fused by
    Horovod's background thread as they arrive), and Keras' SGD with
    momentum. It hands Horovod the `tf.Variable`s behind the Keras ones, as
    the engine does (`horovod_ranks.tf_variables`), and the engine's cycle
    time on CPU (`set_cycle_time`). No weight decay, no metrics beyond the
    loss: a few ms less work than the engine's step.
    """
    import horovod.tensorflow as hvd
    import keras
    import numpy as np
    import tensorflow as tf

    from tf_resnet import models
    from tf_resnet.distribute.horovod_ranks import set_cycle_time, tf_variables

    size, classes = model_shape(spec["model"])
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(
        spec.get("inter_op_threads", 1)
    )
    set_cycle_time()
    hvd.init()
    keras.utils.set_random_seed(0)
    model = models.build_model(spec["model"], classes, (size, size, 3))
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    variables = model.trainable_variables
    optimizer.build(variables)
    hvd.broadcast_variables(tf_variables(model.variables), root_rank=0)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, tf_variables(variables))
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    batch = spec["global_batch"] // hvd.size()
    rng = np.random.default_rng(0)
    images = tf.constant(
        rng.normal(size=(batch, size, size, 3)).astype("float32")
    )
    labels = tf.constant(rng.integers(0, classes, size=batch).astype("int32"))

    each_step = []

    def block(steps):
        start = time.perf_counter()
        for _ in range(steps):
            began = time.perf_counter()
            loss = step(images, labels)
            each_step.append(time.perf_counter() - began)
        loss.numpy()
        return time.perf_counter() - start

    block(spec["warmup_steps"])
    each_step.clear()
    process_cpu = time.process_time()
    seconds = [block(spec["steps"]) for _ in range(spec["blocks"])]
    process_cpu = time.process_time() - process_cpu
    if hvd.rank() == 0:
        print(RESULT + json.dumps({
            "step_s": [s / spec["steps"] for s in seconds],
            "process_cpu_s": process_cpu / (spec["steps"] * spec["blocks"]),
            "each_step_s": each_step,
            "inter_op_threads":
                tf.config.threading.get_inter_op_parallelism_threads(),
        }), flush=True)  # fmt: skip
    hvd.shutdown()


def _summed_as_gradients(mode, tensors):
    """`tensors` summed over the processes as a step sums its gradients.

    In a replica function: Horovod's mode by its grouped all-reduce,
    multi_worker by the replica context's (the Keras optimizer's).
    """
    import tensorflow as tf

    local = [tf.identity(t) for t in tensors]  # the replica's own
    if getattr(mode, "strategy", None) is None:
        return mode.all_reduce_gradients(local)
    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, local)


def communication_alone(mode, model, repeats=3):
    """Seconds of a step's all-reduces with nothing computed, `repeats` times.

    What a synchronous step sends, sent as it sends it: the gradients as a
    list shaped like the trainable variables (Horovod: the mode's grouped
    all-reduce; multi_worker: the replica context's, as the optimizer's),
    then the metrics. Set beside the sweep's one tensor of the same bytes,
    it tells the cost of the list from the cost of the rest of the step.
    """
    import tensorflow as tf

    # Arguments, not constants made in the function: Horovod's all-reduce
    # of those came back in 0.3 ms at 2 processes, not done at each call.
    tensors = [tf.ones(v.shape) for v in model.trainable_variables]

    @tf.function(autograph=False)
    def step(tensors):
        def replica_fn():
            grads = _summed_as_gradients(mode, tensors)
            # Every sum is used, so none of the all-reduces is pruned.
            total = tf.add_n([tf.reduce_sum(g) for g in grads])
            return {"loss_sum": total, "correct": total, "examples": total}

        return mode.reduce_sum(mode.run(replica_fn, ()))

    mode.fetch(step(tensors))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        mode.fetch(step(tensors))
        samples.append(time.perf_counter() - start)
    return samples


class _Uncommunicated:
    """A mode whose gradients are not all-reduced (the rest is the mode's)."""

    def __init__(self, mode):
        self._mode = mode

    def __getattr__(self, name):
        return getattr(self._mode, name)

    def all_reduce_gradients(self, grads):
        return grads


def compute_alone(mode, model, optimizer, config, iterator, spec):
    """Seconds per step of Horovod's step without its all-reduces.

    Timed in the 2-node job after its synchronous steps, every node
    computing at once: the 1-node step as this job's processes compute it,
    to set beside the twin 1-node jobs'. The nodes' weights part here, so
    it runs after every synchronous step of the job.
    """
    import tensorflow as tf

    from tf_resnet import train_loop

    replica_fn = train_loop.make_replica_fn(
        model, optimizer, _Uncommunicated(mode), config
    )

    @tf.function(autograph=False)
    def step(iterator):
        return replica_fn(*next(iterator))

    mode.fetch(step(iterator))
    per_step = []
    for _ in range(spec["blocks"]):
        start = time.perf_counter()
        for _ in range(spec["steps"]):
            metrics = step(iterator)
        mode.fetch(metrics)
        per_step.append((time.perf_counter() - start) / spec["steps"])
    return per_step


def sweep(mode, sizes, repeats, fp16=False):
    """Seconds of one all-reduce of a float32 tensor of each size (bytes).

    With `fp16`, as `--gradient_compression=fp16` all-reduces it.
    """
    import tensorflow as tf

    # Horovod's mode compresses by itself; the replica context's all-reduce
    # is handed float16, as the optimizer's compressed one is.
    horovod = getattr(mode, "strategy", None) is None
    dtype = tf.float16 if fp16 and not horovod else tf.float32
    times = {}
    for nbytes in sizes:
        tensor = tf.cast(tf.ones([max(1, nbytes // 4)]), dtype)

        @tf.function
        def all_reduce(t):
            # Its first element: one number to fetch, whatever the size.
            summed = mode.run(lambda: _summed_as_gradients(mode, [t]), ())
            return summed[0][0]

        all_reduce(tensor).numpy()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            all_reduce(tensor).numpy()
            samples.append(time.perf_counter() - start)
        times[str(nbytes)] = statistics.median(samples)
    return times


def serve_rendezvous(hosts):
    """Horovod's Gloo rendezvous for `hosts` ("addr:slots,...").

    What `horovodrun` starts for a Gloo job.
    """
    from horovod.runner.common.util.hosts import (
        get_host_assignments,
        parse_hosts,
    )
    from horovod.runner.http.http_server import RendezvousServer

    parsed = parse_hosts(hosts)
    plan = get_host_assignments(parsed, sum(h.slots for h in parsed))
    server = RendezvousServer(False)
    port = server.start()
    server.init(plan)
    print(port, flush=True)
    for slot in plan:
        print(json.dumps(slot.to_response_string()), flush=True)
    while True:
        time.sleep(3600)


# --- the driver -----------------------------------------------------------


class Job:
    """The processes of one configuration, on the cluster's nodes."""

    port = 23000

    def __init__(self, cluster, spec, nodes, first_node=0):
        self.cluster = cluster
        self.spec = spec
        self.nodes = nodes
        self.first_node = first_node
        Job.port += 10

    def worker_argv(self, extra=None):
        spec = dict(self.spec, **(extra or {}))
        return [PYTHON, HERE, "--worker", json.dumps(spec)]

    def run(self, timeout=900):
        """Runs the job; returns its chief's result."""
        try:
            return self.collect(self.start(), timeout)
        finally:
            self.cluster.stop_processes()

    def start(self):
        """Starts every process; returns the chief's."""
        engine = self.spec["flags"]["distribution"]
        env = {
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
        if engine in ("horovod", "averaging"):
            return self._horovod(env)
        if engine == "multi_worker":
            return self._multi_worker(env)
        return self._parameter_server(env)

    @staticmethod
    def collect(chief, timeout=900):
        """The result line of a started job's chief."""
        out, err = chief.communicate(timeout=timeout)
        for line in out.splitlines():
            if RESULT in line:
                return json.loads(line.split(RESULT, 1)[1])
        raise RuntimeError(f"no result:\n{out[-2000:]}\n{err[-4000:]}")

    @property
    def node_range(self):
        return range(self.first_node, self.first_node + self.nodes)

    def _spawn_worker(self, index, node, env):
        """Process `index` of the job on `node`; the first reports."""
        output = subprocess.PIPE if index == 0 else subprocess.DEVNULL
        return self.cluster.spawn(
            node,
            self.worker_argv(),
            cpus=self._cpu(node),
            env=env,
            stdout=output,
            stderr=output,
            text=True,
        )

    def _cpu(self, node):
        return node % 2

    def _horovod(self, env):
        hosts = ",".join(
            f"{self.cluster.address(n)}:1" for n in self.node_range
        )
        server = self.cluster.spawn(
            None,
            [PYTHON, HERE, "--rendezvous", hosts],
            stdout=subprocess.PIPE,
            text=True,
        )
        port = server.stdout.readline().strip()
        chief = None
        for rank, node in enumerate(self.node_range):
            rank_env = {
                **env,
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": emulated_cluster.HUB_ADDRESS,
                "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "HOROVOD_GLOO_IFACE": "eth0",
                "HOROVOD_HOSTNAME": self.cluster.address(node),
                "HOROVOD_RANK": str(rank),
                "HOROVOD_SIZE": str(self.nodes),
                "HOROVOD_LOCAL_RANK": "0",
                "HOROVOD_LOCAL_SIZE": "1",
                "HOROVOD_CROSS_RANK": str(rank),
                "HOROVOD_CROSS_SIZE": str(self.nodes),
            }
            process = self._spawn_worker(rank, node, rank_env)
            chief = chief or process
        return chief

    def _multi_worker(self, env):
        workers = [
            f"{self.cluster.address(n)}:{self.port}" for n in self.node_range
        ]
        chief = None
        for index, node in enumerate(self.node_range):
            tf_config = {
                "cluster": {"worker": workers},
                "task": {"type": "worker", "index": index},
            }
            process = self._spawn_worker(
                index, node, {**env, "TF_CONFIG": json.dumps(tf_config)}
            )
            chief = chief or process
        return chief

    def _parameter_server(self, env):
        """The ps and coordinator on a node of their own; a worker per node."""
        ps_node = self.cluster.nodes - 1
        ps_hosts = [f"{self.cluster.address(ps_node)}:{self.port}"]
        worker_hosts = [
            f"{self.cluster.address(n)}:{self.port + 1}"
            for n in range(self.nodes)
        ]
        cluster_flags = [
            f"--ps_hosts={','.join(ps_hosts)}",
            f"--worker_hosts={','.join(worker_hosts)}",
        ]
        # Two inter-op threads: with one, a worker's step (receives from
        # the ps beside its computation) deadlocks.
        server_flags = [
            "--intra_op_threads=1", "--inter_op_threads=2", "--dtype=float32",
        ]  # fmt: skip
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        servers = {}
        servers["ps"] = self.cluster.spawn(
            ps_node,
            [PYTHON, MAIN, "--job_name=ps", "--task_index=0", *cluster_flags,
             *server_flags],
            env=env, **quiet,
        )  # fmt: skip
        for node in range(self.nodes):
            # Not pinned: a TensorFlow worker server pinned to one core
            # (taskset -c) never finishes a step. One intra-op thread, but
            # with its two inter-op ones a worker alone computes on both
            # cores (its CPU time per update exceeds its step).
            servers[f"worker {node}"] = self.cluster.spawn(
                node,
                [PYTHON, MAIN, "--job_name=worker", f"--task_index={node}",
                 *cluster_flags, *server_flags],
                env=env, **quiet,
            )  # fmt: skip
        flags = {"ps_hosts": ps_hosts, "worker_hosts": worker_hosts}
        spec = dict(
            self.spec,
            flags={**self.spec["flags"], **flags},
            cpu_of={name: p.pid for name, p in servers.items()},
        )
        return self.cluster.spawn(
            ps_node,
            [PYTHON, HERE, "--worker", json.dumps(spec)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def check_link(cluster):
    """TCP goodput between two nodes (iperf3), in Mbit/s."""
    server = cluster.spawn(
        1, ["iperf3", "-s", "-1", "-B", cluster.address(1)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    out = subprocess.run(
        cluster.command(0, ["iperf3", "-c", cluster.address(1), "-t", "3",
                            "-J"]),
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    server.wait(timeout=10)
    cluster.stop_processes()
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6


@dataclasses.dataclass(frozen=True)
class Row:
    """One configuration: an engine and its knobs, on 1 node and on 2.

    Attributes:
      name: the row's label.
      flags: `resnet_main.py` settings of the run.
      knob: whether it is a knob's row (`--knobs`) or an engine's.
      overlap: a row of the overlap comparison (`--overlap`): the one
        all-reduce after the backward pass, and the plain Horovod script.
      script: not the engine's step but this one (`tape`:
        `run_tape_script`), on the engine's processes.
      buckets: a row of another bucket size (`--bucket_sizes`).
      inter_op_threads: of each process, where not the run's
        (`--inter_op_threads`; 0: the run's).
    """

    name: str
    flags: dict
    knob: bool = False
    overlap: bool = False
    script: str = ""
    buckets: bool = False
    inter_op_threads: int = 0

    # The fields a row sets in its jobs' spec.
    SPEC_KEYS = ("script", "inter_op_threads")

    @property
    def job_spec(self):
        """What the row's jobs set in the job spec beyond the run's."""
        own = {key: getattr(self, key) for key in self.SPEC_KEYS}
        return {key: value for key, value in own.items() if value}

    @property
    def engine(self):
        return self.flags["distribution"]

    @property
    def accumulate_steps(self):
        return self.flags.get("accumulate_steps", 1)


def rows(average_every, pack_bytes, bucket_sizes=()):
    """The engines, then the knobs measured beside them."""
    packs = {"all_reduce_pack_bytes": pack_bytes}
    pack_mb = f"{pack_bytes / 2**20:g} MiB"
    return [
        *(
            Row(f"{engine}, buckets of {mib:g} MiB",
                {"distribution": engine,
                 "all_reduce_pack_bytes": int(mib * 2**20)},
                buckets=True)
            for engine in ("horovod", "multi_worker")
            for mib in bucket_sizes
        ),
        Row("horovod", {"distribution": "horovod"}),
        Row("multi_worker", {"distribution": "multi_worker"}),
        Row(
            f"averaging every {average_every}",
            {"distribution": "averaging", "average_every": average_every},
        ),
        Row("parameter_server", {"distribution": "parameter_server"}),
        Row("horovod, fp16", {"distribution": "horovod",
                              "gradient_compression": "fp16"}, True),
        Row("multi_worker, fp16", {"distribution": "multi_worker",
                                   "gradient_compression": "fp16"}, True),
        Row(f"horovod, packs of {pack_mb}",
            {"distribution": "horovod", **packs}, True),
        Row(f"multi_worker, packs of {pack_mb}",
            {"distribution": "multi_worker", **packs}, True),
        Row("horovod, accumulate 4",
            {"distribution": "horovod", "accumulate_steps": 4}, True),
        Row("horovod, one group",
            {"distribution": "horovod", "overlap_all_reduce": False},
            overlap=True),
        Row("DistributedGradientTape script", {"distribution": "horovod"},
            overlap=True, script="tape"),
        Row("multi_worker, one pack",
            {"distribution": "multi_worker", "overlap_all_reduce": False},
            overlap=True),
        # A second inter-op thread, as TensorFlow's default gives a node
        # of more than one core: the all-reduce's ops need not wait for
        # the backward pass's on the one thread.
        *(
            Row(f"{name}, 2 inter-op threads", {"distribution": engine},
                overlap=True, script=script, inter_op_threads=2)
            for name, engine, script in (
                ("horovod", "horovod", ""),
                ("DistributedGradientTape script", "horovod", "tape"),
                ("multi_worker", "multi_worker", ""),
            )
        ),
    ]  # fmt: skip


def measure_model(cluster, model, args, network, log):
    """Every measurement of one model, as a dict (the `--out` file's)."""
    batch = args.batch.get(model, 32)
    base = {
        "model": model,
        "inter_op_threads": args.inter_op_threads,
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "blocks": args.blocks,
    }

    def spec_of(flags, processes, extra=None):
        return {
            **base,
            "flags": flags,
            # Accumulation keeps each micro-batch at `batch`.
            "global_batch": batch
            * processes
            * flags.get("accumulate_steps", 1),
            **(extra or {}),
        }

    def described(flags, extra):
        """The flags, and what a row's own job spec adds (`Row.job_spec`)."""
        own = [f"{k}={extra[k]}" for k in Row.SPEC_KEYS if (extra or {}).get(k)]
        return f"{flags}" + (f" ({', '.join(own)})" if own else "")

    def job(flags, nodes, extra=None):
        processes = 1 if flags["distribution"] == "parameter_server" else nodes
        log(f"  {model} {described(flags, extra)} on {nodes} node(s) ...")
        return Job(cluster, spec_of(flags, processes, extra), nodes).run()

    def twin(flags, extra=None):
        """Two 1-node jobs at once, one per core.

        The step of one node whose neighbour computes too, as in every
        2-node run here (two nodes of this machine share its caches and
        memory; real ones do not). A synchronous step waits for the slower
        node: its median is the row's 1-node step.
        """
        log(f"  {model} {described(flags, extra)} on 1 node, twice at "
            "once ...")  # fmt: skip
        jobs = [Job(cluster, spec_of(flags, 1, extra), 1, n) for n in (0, 1)]
        try:
            chiefs = [j.start() for j in jobs]
            runs = [Job.collect(chief) for chief in chiefs]
        finally:
            cluster.stop_processes()
        slower = max(runs, key=lambda run: statistics.median(run["step_s"]))
        each = [statistics.median(run["step_s"]) for run in runs]
        return {
            "step_s": slower["step_s"],
            "process_cpu_s": slower.get("process_cpu_s"),
            "each_node_s": each,
            "paired_s": paired_slower(
                *(run["each_step_s"] for run in runs),
                flags.get("average_every", 1),
            ),
            "slower_mean_s": max(
                statistics.fmean(run["each_step_s"]) for run in runs
            ),
        }

    # The 1-node Horovod step sets the slow-down (no network in it).
    cluster.shape(UNSHAPED_MBIT)
    reference = job({"distribution": "horovod"}, 1)
    cpu_step = statistics.median(reference["step_s"])
    gpu = scaling.GPU_STEPS[model]
    slowdown = cpu_step / (gpu.ms / 1e3)
    # Unshaped: the links as fast as the machine moves bytes (the
    # all-reduce's cost in software alone).
    rate = UNSHAPED_MBIT if network is None else network.gbit * 1e3 / slowdown
    cluster.shape(rate)
    goodput = check_link(cluster)
    log(f"  {model}: CPU step {1e3 * cpu_step:.0f} ms, s = {slowdown:.1f}, "
        f"link {rate:.1f} Mbit/s, iperf3 {goodput:.1f}")  # fmt: skip
    n = reference["gradient_bytes"]
    sizes = sorted({4096, 65536, n // 16, n // 4, n, 2 * n})
    result = {
        "model": model,
        "batch_per_process": batch,
        "bucket_bytes": traffic.DEFAULT_BUCKET_BYTES,
        "inter_op_threads": args.inter_op_threads,
        "network": UNSHAPED if network is None else network.name,
        "cpu_step_s": cpu_step,
        "slowdown": slowdown,
        "link_mbit": rate,
        "iperf3_mbit": goodput,
        "gradient_bytes": n,
        "tensors": reference["tensors"],
        "state_bytes": reference["state_bytes"],
        "sweeps": {},
        "rows": [],
    }
    wanted = args.only.split(",") if args.only else None
    transports = {"horovod": {}, "multi_worker": {}}
    if args.knobs:
        fp16 = {"gradient_compression": "fp16"}
        transports.update({"horovod+fp16": fp16, "multi_worker+fp16": fp16})
    for transport, knobs in transports.items():
        engine = transport.split("+")[0]
        if wanted and engine not in wanted:
            continue
        for processes in (2, 4):
            run = job(
                {"distribution": engine, **knobs},
                processes,
                {"sweep": sizes, "sweep_repeats": args.sweep_repeats,
                 "steps": 1, "blocks": 1, "warmup_steps": 1},
            )  # fmt: skip
            result["sweeps"][f"{transport} {processes}"] = run["sweep"]

    def chosen(row):
        if wanted and row.engine not in wanted:
            return False
        overlaps = engines.ENGINES[row.engine].overlaps
        engine_row = not (row.knob or row.overlap or row.buckets)
        if args.bucket_sizes:  # Their default bucket size, and others.
            return row.buckets or (overlaps and engine_row)
        if args.overlap:  # The engines that overlap, and their controls.
            return row.overlap or (overlaps and engine_row)
        return engine_row or (row.knob and args.knobs)

    sizes = [float(m) for m in args.bucket_sizes.split(",") if m]
    every_row = rows(args.average_every, args.pack_bytes, sizes)
    selected = [row for row in every_row if chosen(row)]
    # Rounds: every row once per round, in alternating order, so that a
    # drift of the machine's speed touches all rows alike; each round's
    # job is one sample of the row's step.
    # parameter_server's row also runs its jobs on unshaped links, each
    # round: its step without the network (`predict_row`).
    jobs = {row.name: {"1": [], "2": []} for row in selected}
    for round_ in range(args.rounds):
        log(f"  {model}: round {round_ + 1} of {args.rounds}")
        for row in selected if round_ % 2 == 0 else selected[::-1]:
            ps = row.engine == "parameter_server"
            own = row.job_spec
            jobs[row.name]["1"].append(
                job(row.flags, 1) if ps else twin(row.flags, own)
            )
            # The synchronous engines' 2-node jobs also time their step's
            # all-reduces alone (`communication_alone`), and Horovod's its
            # step without them (`compute_alone`).
            plain = row.flags == {"distribution": row.engine} and not own
            extra = {"communication_alone": plain and not ps, **own}
            jobs[row.name]["2"].append(job(row.flags, 2, extra))
            if ps:
                cluster.shape(UNSHAPED_MBIT)
                for nodes in (1, 2):
                    unshaped = jobs[row.name].setdefault(
                        f"{nodes} unshaped", []
                    )
                    unshaped.append(job(row.flags, nodes))
                cluster.shape(rate)
    for row in selected:
        runs = jobs[row.name]
        measured = {
            "name": row.name,
            "flags": row.flags,
            "script": row.script,
            "inter_op_threads": runs["2"][0]["inter_op_threads"],
        }
        for key, samples in runs.items():
            medians = [statistics.median(run["step_s"]) for run in samples]
            steps = [s for run in samples for s in run["step_s"]]
            measured[key] = {
                "step_s": statistics.median(medians),
                "rounds": medians,
                "range": [min(steps), max(steps)],
                "samples": steps,
                **({"each_node_s": [run["each_node_s"] for run in samples]}
                   if "each_node_s" in samples[0] else {}),
                **({key: [min(run[key]) for run in samples]
                    for key in ("average_s", "communication_s")
                    if key in samples[0]}),
                **({"compute_s": [statistics.median(run["compute_s"])
                                  for run in samples]}
                   if "compute_s" in samples[0] else {}),
                **({key: [run[key] for run in samples]
                    for key in ("paired_s", "slower_mean_s")}
                   if "paired_s" in samples[0] else {}),
                **({"cpu_s": [run["cpu_s"] for run in samples]}
                   if "cpu_s" in samples[0] else {}),
                **({"process_cpu_s": [run["process_cpu_s"]
                                      for run in samples]}
                   if samples[0].get("process_cpu_s") else {}),
            }  # fmt: skip
        result["rows"].append(measured)
    return result


def paired_slower(first, second, every=1):
    """The mean step of two nodes that wait for each other.

    They wait every `every` steps (averaging's period; 1: at each). Each
    node's steps as the twin jobs timed them, in runs of `every`;
    every run of one node paired with every run of the other (the nodes'
    spreads independent): the mean of the slower of each pair, per step.
    It exceeds the slower node's mean by what stragglers cost.
    """

    def runs(steps):
        return [sum(steps[i : i + every]) for i in range(0, len(steps), every)]

    return (
        statistics.fmean(max(a, b) for a in runs(first) for b in runs(second))
        / every
    )


# The all-reduce that carries each engine here: averaging runs on Horovod's
# ranks (`Job._horovod`).
TRANSPORT = {"averaging": "horovod"}


def knobs_of(flags, script="", bucket_bytes=None, threads=None):
    """The `traffic.Knobs` of a row's flags (and script).

    Float16's halved bytes are in its own fitted transport, not here. The
    `DistributedGradientTape` script all-reduces each tensor as it
    appears, and Horovod fuses the tensors ready in one cycle into one
    message: modelled as the engine's buckets (a bucket per tensor would
    pay each one's latency, which fusion does not). An engine whose
    overlap waits for a second inter-op thread does not overlap on
    `threads` 1: its buckets go one after another after the backward pass.
    """
    del script
    engine = engines.ENGINES[flags["distribution"]]
    overlaps = flags.get("overlap_all_reduce", True)
    overlap = overlaps and not (
        engine.overlap_waits_for_a_thread and threads == 1
    )
    packs = flags.get("all_reduce_pack_bytes", 0)
    return traffic.Knobs(
        pack_bytes=packs or (bucket_bytes if overlaps else 0) or 0,
        accumulate_steps=flags.get("accumulate_steps", 1),
        average_every=flags.get("average_every", 1),
        overlap=overlap,
    )


def gradients_of(model):
    """`traffic.Gradients` of a model at the size it trains on here."""
    size, _ = model_shape(model)
    return scaling.gradients_of(model, size)


def fits_of(result):
    """`{transport: RingFit}` fitted to a model's all-reduce sweeps.

    A float16 transport's fit is in float32 bytes (what it is handed).
    """
    samples = {}
    for key, sweep in result["sweeps"].items():
        transport, processes = key.split()
        samples.setdefault(transport, []).extend(
            (int(nbytes), int(processes), seconds)
            for nbytes, seconds in sweep.items()
        )
    return {t: scaling.fit_ring(s) for t, s in samples.items()}


def transport_of(flags):
    """The fitted transport that carries a row's communication."""
    engine = TRANSPORT.get(flags["distribution"], flags["distribution"])
    fp16 = flags.get("gradient_compression") == "fp16"
    return f"{engine}+fp16" if fp16 else engine


def communication_cpu(row, round_=None):
    """CPU time per step a row's 2-node jobs spend beyond its 1-node jobs.

    What the all-reduce costs the one core a node has here (Gloo's or
    gRPC's threads, the kernel's TCP): overlapped, it competes with the
    backward pass for that core, where a GPU node's CPU does it beside
    the GPU's computation. Its median over the rounds, or `round_`'s; 0
    for runs saved before it was measured.
    """
    ones = row["1"].get("process_cpu_s")
    twos = row["2"].get("process_cpu_s")
    if not ones or not twos:
        return 0.0
    extra = [max(0.0, t - o) for o, t in zip(ones, twos, strict=True)]
    if round_ is not None and round_ < len(extra):
        return extra[round_]
    return statistics.median(extra)


def threads_of(result, row):
    """The inter-op threads of a row's processes.

    Runs saved before rows recorded them: the row's flag, else the run's.
    """
    return (
        row.get("inter_op_threads")
        or row["flags"].get("inter_op_threads")
        or result.get("inter_op_threads", 1)
    )


def predict_row(result, fits, row, one, round_=None, gradients=None):
    """The model's 2-node step of a row whose 1-node step is `one`.

    `round_`: the row's unshaped steps are that round's, where measured.
    `gradients`: the model's `traffic.Gradients` (`gradients_of`).
    """
    gradients = gradients or gradients_of(result["model"])
    flags = row["flags"]
    engine = engines.ENGINES[flags["distribution"]]

    def step(key):
        measured = row[key]
        rounds = measured.get("rounds", [])
        if round_ is not None and round_ < len(rounds):
            return rounds[round_]
        return measured["step_s"]

    if engine.traffic is traffic.PUSH_PULL:
        if "1 unshaped" not in row:
            sys.exit(
                f"network_scaling: the {row['name']} row has no jobs on "
                "unshaped links (a run saved before they were measured): "
                "run it again"
            )
        # One worker's pull and push: its 1-node step less the same job's
        # on unshaped links. The step without the network on two nodes is
        # the 2-node job's on unshaped links, as the twin 1-node jobs are
        # the synchronous engines': here the two workers, the ps and the
        # coordinator share the machine's two cores (the workers, unpinned,
        # each compute on both when alone), which on a cluster they do not.
        fit = scaling.RingFit(
            0, 0, 2 * result["gradient_bytes"] / (one - step("1 unshaped"))
        )
        base = 2 * step("2 unshaped")  # A worker's step: two per update.
    else:
        fit, base = fits[transport_of(flags)], one
        # The buckets of the run's default size (runs before it was
        # saved: 4 MiB, the default then).
        default = result.get("bucket_bytes", 4 * 2**20)
        knobs = knobs_of(
            flags, row.get("script", ""), default, threads_of(result, row)
        )
        # Overlapped, the communication's CPU time is added to the step
        # but not to the backward pass the buckets hide behind: on a node
        # of one core it runs between that pass's ops, not beside them.
        cpu = 0.0
        if engine.overlaps and knobs.overlap:
            cpu = communication_cpu(row, round_)
        return (
            scaling.predict_two_nodes(engine, knobs, base, fit, gradients) + cpu
        )
    return scaling.predict_two_nodes(
        engine, knobs_of(flags), base, fit, gradients
    )


def report(results):
    """The Markdown tables of `results` (the `--out` file)."""
    lines = [f"{results['cpu']}, {results['date']}", ""]
    for result in results["models"]:
        fits = fits_of(result)
        gradients = gradients_of(result["model"])
        link = result["link_mbit"] * 1e6 / 8
        lines += [
            f"### {result['model']}, batch {result['batch_per_process']} per "
            f"process, {result['network']} seen from a GPU",
            "",
            f"CPU step {1e3 * result['cpu_step_s']:.0f} ms, GPU step "
            f"{scaling.GPU_STEPS[result['model']].ms:.2f} ms: s = "
            f"{result['slowdown']:.1f}; link {result['link_mbit']:.1f} Mbit/s, "
            f"iperf3 goodput {result['iperf3_mbit']:.1f} Mbit/s "
            f"({100 * result['iperf3_mbit'] / result['link_mbit']:.1f}%); "
            f"gradients {result['gradient_bytes'] / 1e6:.2f} MB",
            "",
            "| all-reduce | size MB | measured ms | fit ms | error |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key, sweep in result["sweeps"].items():
            transport, processes = key.split()
            for nbytes, seconds in sweep.items():
                fitted = fits[transport](int(nbytes), int(processes))
                lines.append(
                    f"| {transport}, {processes} processes | "
                    f"{int(nbytes) / 1e6:.3f} | {1e3 * seconds:.1f} | "
                    f"{1e3 * fitted:.1f} | "
                    f"{100 * (fitted / seconds - 1):+.0f}% |"
                )
        lines += ["", "| transport | c ms | a ms | B MB/s | B / link |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for transport, fit in fits.items():
            lines.append(
                f"| {transport} | {1e3 * fit.c:.2f} | {1e3 * fit.a:.3f} | "
                f"{fit.bandwidth / 1e6:.1f} | {fit.bandwidth / link:.2f} |"
            )
        lines += [
            "",
            "| engine | 1 node ms | 2 nodes ms | 2 nodes, each round ms | "
            "speed-up | efficiency, each round | predicted 2 nodes ms | "
            "error | error, each round |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in result["rows"]:
            one, two = row["1"]["step_s"], row["2"]["step_s"]
            engine = engines.ENGINES[row["flags"]["distribution"]]
            predict = functools.partial(
                predict_row, result, fits, row, gradients=gradients
            )
            # Each round's 1-node and 2-node jobs ran one after the other:
            # its error is free of the machine's drift between rounds.
            ones = row["1"].get("rounds", [one])
            twos = row["2"].get("rounds", [two])
            errors = [
                predict(o, i) / t - 1
                for i, (o, t) in enumerate(zip(ones, twos, strict=True))
            ]
            # Throughput of 2 against 1: a synchronous step does twice the
            # work; a parameter-server step is one update either way.
            speedup = one / two * (1 if engine.asynchronous else 2)
            # Each round's 2-node throughput against twice its 1-node one.
            efficiency = [
                o / t * (0.5 if engine.asynchronous else 1)
                for o, t in zip(ones, twos, strict=True)
            ]
            lines.append(
                f"| {row['name']} | {1e3 * one:.0f} | {1e3 * two:.0f} | "
                f"{', '.join(f'{1e3 * t:.0f}' for t in twos)} | "
                f"{speedup:.2f}x | "
                f"{', '.join(f'{100 * e:.0f}%' for e in efficiency)} | "
                f"{1e3 * predict(one):.0f} | "
                f"{100 * statistics.median(errors):+.1f}% | "
                f"{', '.join(f'{100 * e:+.0f}%' for e in errors)} |"
            )
        for row in result["rows"]:
            if "paired_s" not in row["1"]:
                continue
            predict = functools.partial(
                predict_row, result, fits, row, gradients=gradients
            )
            pairs = zip(row["1"]["paired_s"], row["1"]["slower_mean_s"],
                        row["2"]["rounds"], strict=True)  # fmt: skip
            lines += [
                "",
                f"{row['name']}, stragglers: each round's 1-node step as "
                "the slower node's mean, as the mean of the slower of "
                "every pair of the two nodes' steps (between all-reduces; "
                "a synchronous step waits for the slower node), and the "
                "model's error with the second: "
                + "; ".join(
                    f"{1e3 * slower:.0f}, {1e3 * paired:.0f} ms, "
                    f"{100 * (predict(paired, i) / two - 1):+.0f}%"
                    for i, (paired, slower, two) in enumerate(pairs)
                )
                + ".",
            ]
        for row in result["rows"]:
            if not row["2"].get("process_cpu_s"):
                continue
            extra = [
                communication_cpu(row, i)
                for i in range(len(row["2"]["process_cpu_s"]))
            ]
            lines += [
                "",
                f"{row['name']}: the chief's CPU time per step, 1 node and "
                "2 nodes, each round: "
                + "; ".join(
                    f"{1e3 * o:.0f}, {1e3 * t:.0f} ms"
                    for o, t in zip(row["1"]["process_cpu_s"],
                                    row["2"]["process_cpu_s"], strict=True)
                )
                + "; the communication's, the difference: "
                + ", ".join(f"{1e3 * e:.0f}" for e in extra)
                + " ms (added to the step the overlapped rows' model starts "
                "from: on one core it competes with the backward pass).",
            ]  # fmt: skip
            if engines.ENGINES[row["flags"]["distribution"]].asynchronous:
                continue
            # A node's one core cannot run a step in less than the
            # process's CPU time per step: however well the all-reduce
            # hides, the efficiency is at most the 1-node step over it.
            ceilings = zip(row["1"]["rounds"], row["2"]["process_cpu_s"],
                           strict=True)  # fmt: skip
            lines[-1] += (
                " The most a node of one core allows, each round's 1-node "
                "step over its 2-node CPU time per step: "
                + ", ".join(f"{100 * o / c:.0f}%" for o, c in ceilings)
                + "."
            )
        for row in result["rows"]:
            if "1 unshaped" not in row:
                continue
            pairs = zip(row["1"]["rounds"], row["1 unshaped"]["rounds"],
                        strict=True)  # fmt: skip
            network = [one - fast for one, fast in pairs]
            lines += [
                "",
                f"{row['name']}: one worker's pull and push, its 1-node "
                "step less the same job's on unshaped links, each round: "
                + ", ".join(f"{1e3 * t:.0f}" for t in network)
                + " ms; as a bandwidth ("
                f"{2 * result['gradient_bytes'] / 1e6:.2f} MB over it), "
                + ", ".join(
                    f"{2 * result['gradient_bytes'] / t / link:.2f}"
                    for t in network
                )
                + " of the link's rate.",
            ]
        for row in result["rows"]:
            # Runs saved before only parameter_server's jobs measured it
            # have the CPU time of other chiefs alone.
            if "ps" not in row["2"].get("cpu_s", [{}])[0]:
                continue
            cores = results.get("cores", 2)
            lines += [
                "",
                f"{row['name']}: CPU time per update over the timed steps, "
                "each round (the chief is the coordinator), against the "
                f"step; all of it over the machine's {cores} cores is a "
                "floor under the step:",
                "",
                "| nodes | round | ps ms | workers ms | coordinator ms | "
                f"all ms | all over {cores} cores ms | step ms |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for nodes in ("1", "2", "1 unshaped", "2 unshaped"):
                if nodes not in row:
                    continue
                pairs = zip(row[nodes]["cpu_s"], row[nodes]["rounds"],
                            strict=True)  # fmt: skip
                for i, (cpu, step) in enumerate(pairs):
                    workers = sum(
                        t for n, t in cpu.items() if n.startswith("worker")
                    )
                    every = sum(cpu.values())
                    lines.append(
                        f"| {nodes} | {i + 1} | {1e3 * cpu['ps']:.0f} | "
                        f"{1e3 * workers:.0f} | {1e3 * cpu['chief']:.0f} | "
                        f"{1e3 * every:.0f} | {1e3 * every / cores:.0f} | "
                        f"{1e3 * step:.0f} |"
                    )
        for row in result["rows"]:
            if "average_s" not in row["2"]:
                continue
            nbytes = result.get("state_bytes", 2 * result["gradient_bytes"])
            fitted = fits[transport_of(row["flags"])](nbytes, 2)
            each = ", ".join(f"{1e3 * t:.0f}" for t in row["2"]["average_s"])
            lines += [
                "",
                f"{row['name']}: its all-reduce of {nbytes / 1e6:.1f} MB "
                f"(weights, statistics, slots) alone in the 2-node jobs: "
                f"{each} ms (each round's fastest of 3); the fit: "
                f"{1e3 * fitted:.0f} ms.",
            ]
        for row in result["rows"]:
            if "communication_s" not in row["2"]:
                continue
            n = result["gradient_bytes"]
            sizes = result["sweeps"][f"{row['flags']['distribution']} 2"]
            one_tensor = sizes[str(n)]
            each = ", ".join(
                f"{1e3 * t:.0f}" for t in row["2"]["communication_s"]
            )
            lines += [
                "",
                f"{row['name']}: its step's all-reduces alone in the 2-node "
                f"jobs (the gradients as a list of {result['tensors']} "
                f"tensors, then the metrics): {each} ms (each round's "
                f"fastest of 3); the sweep's one tensor of "
                f"{n / 1e6:.2f} MB: {1e3 * one_tensor:.0f} ms; the 2-node "
                "step less the 1-node step, each round: "
                + ", ".join(
                    f"{1e3 * (t - o):.0f}"
                    for o, t in zip(
                        row["1"]["rounds"], row["2"]["rounds"], strict=True
                    )
                )
                + " ms.",
            ]
            if "compute_s" in row["2"]:
                rounds = zip(row["2"]["compute_s"], row["2"]["communication_s"],
                             row["2"]["rounds"], strict=True)  # fmt: skip
                lines[-1] += (
                    " Its step without the all-reduces, timed in the 2-node "
                    "jobs with both nodes computing, plus the all-reduces "
                    "alone, against the 2-node step, each round: "
                    + "; ".join(
                        f"{1e3 * c:.0f} + {1e3 * a:.0f} = {1e3 * (c + a):.0f}"
                        f" against {1e3 * t:.0f} ms"
                        for c, a, t in rounds
                    )
                    + "."
                )
        lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet20,resnet56,resnet18")
    parser.add_argument("--network", default="10gbe",
                        choices=[*sorted(scaling.NETWORKS), UNSHAPED],
                        help="the network the links stand for; unshaped: "
                        "the links unlimited")  # fmt: skip
    parser.add_argument(
        "--batch",
        default="resnet20=128,resnet56=128,resnet18=32",
        help="per process, model=batch,...",
    )
    parser.add_argument("--warmup_steps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--sweep_repeats", type=int, default=5)
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="jobs per row and node count; the row's step is their median",
    )  # fmt: skip
    parser.add_argument("--average_every", type=int, default=4)
    parser.add_argument("--pack_bytes", type=int, default=4 * 2**20)
    parser.add_argument(
        "--knobs", action="store_true", help="also the knobs' rows"
    )
    parser.add_argument(
        "--overlap", action="store_true",
        help="the engines that overlap their all-reduce with the backward "
        "pass, beside their one all-reduce after it and a plain Horovod "
        "script (instead of the other rows)",
    )  # fmt: skip
    parser.add_argument(
        "--bucket_sizes", default="",
        help="MiB, e.g. 1,16: the overlapping engines with these bucket "
        "sizes beside their default (instead of the other rows)",
    )  # fmt: skip
    parser.add_argument(
        "--inter_op_threads", type=int, default=1,
        help="of each synchronous job's process (its node has one core); "
        "0: a run's default (runtime.inter_op_threads)",
    )  # fmt: skip
    parser.add_argument("--only", help="engines of the rows, e.g. horovod")
    parser.add_argument("--out", default="network_scaling.json")
    parser.add_argument("--report", help="print the tables of this --out file")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as stream:
            print(report(json.load(stream)))
        return
    args.batch = {
        k: int(v) for k, v in (p.split("=") for p in args.batch.split(","))
    }
    missing = emulated_cluster.missing_programs() + (
        [] if shutil.which("iperf3") else ["iperf3"]
    )
    if missing:
        sys.exit(f"network_scaling: needs {', '.join(missing)}")
    common.print_environment("Scaling on an emulated network")
    network = scaling.NETWORKS.get(args.network)  # None: unshaped.

    def log(text):
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr,
              flush=True)  # fmt: skip

    results = {"cpu": common.cpu_model(), "date": time.strftime("%Y-%m-%d"),
               "cores": len(os.sched_getaffinity(0)), "models": []}  # fmt: skip
    with emulated_cluster.EmulatedCluster(5) as cluster:
        for model in args.models.split(","):
            results["models"].append(
                measure_model(cluster, model, args, network, log)
            )
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out, "w") as stream:
                json.dump(results, stream, indent=1)
    print(report(results))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        run_worker(json.loads(sys.argv[2]))
    elif sys.argv[1:2] == ["--rendezvous"]:
        serve_rendezvous(sys.argv[2])
    else:
        main()

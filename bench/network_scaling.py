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
  * the step time of each engine on 1 node and on 2, and its efficiency
    against the best single node of the run (`scaling_score`);
  * the model's prediction of each 2-node step
    (`tf_resnet.scaling.predict_two_nodes`), made from what is known
    before the 2-node jobs and written, with a sha256, to
    `<--out>.predictions.json` before they start; then scored, in
    efficiency points, against what they measured.
"""

import argparse
import dataclasses
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
import scaling_score  # noqa: E402

from tf_resnet import scaling, traffic  # noqa: E402
from tf_resnet.engines import registry  # noqa: E402

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
    ps = registry.get(spec["flags"]["distribution"]).asynchronous
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
        result["sweep"], result["sweep_cpu_s"] = sweep(
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

    With `fp16`, as `--gradient_compression=fp16` all-reduces it. Also
    this process's CPU time per all-reduce (every thread of it: the
    transport's own too): what an all-reduce costs a node's core, which
    the 2-node rows' predictions take from here (`communication_cpu`).

    Returns:
      `({bytes: seconds}, {bytes: CPU seconds})`, medians of `repeats`.
    """
    import tensorflow as tf

    # Horovod's mode compresses by itself; the replica context's all-reduce
    # is handed float16, as the optimizer's compressed one is.
    horovod = getattr(mode, "strategy", None) is None
    dtype = tf.float16 if fp16 and not horovod else tf.float32
    times, cpu = {}, {}
    for nbytes in sizes:
        tensor = tf.cast(tf.ones([max(1, nbytes // 4)]), dtype)

        @tf.function
        def all_reduce(t):
            # Its first element: one number to fetch, whatever the size.
            summed = mode.run(lambda: _summed_as_gradients(mode, [t]), ())
            return summed[0][0]

        all_reduce(tensor).numpy()
        samples, cpu_samples = [], []
        for _ in range(repeats):
            start, began = time.perf_counter(), time.process_time()
            all_reduce(tensor).numpy()
            samples.append(time.perf_counter() - start)
            cpu_samples.append(time.process_time() - began)
        times[str(nbytes)] = statistics.median(samples)
        cpu[str(nbytes)] = statistics.median(cpu_samples)
    return times, cpu


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
        engine = registry.get(self.spec["flags"]["distribution"])
        env = {
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
        # The processes its transport connects, as its launcher starts them.
        return getattr(self, f"_{engine.transport.launcher}")(env)

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

    def _tf_config_cluster(self, env):
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

    def _ps(self, env):
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
    """The engines, then the knobs measured beside them.

    Read from the records of the engines that send something between
    nodes (`registry.across_nodes`), so a new one has its rows: bucket
    sizes, the one all-reduce and a second inter-op thread where it
    overlaps, fp16 where it compresses, packs where it takes them,
    `average_every` where it takes local steps, its record's scripts;
    accumulation, the training loop's and not the engine's, on the first.
    """
    sending = registry.across_nodes()
    overlapping = [e for e in sending if e.overlaps]
    packs = {"all_reduce_pack_bytes": pack_bytes}
    pack_mb = f"{pack_bytes / 2**20:g} MiB"

    def plain(engine):
        if engine.update is registry.Update.PROCESS:
            return Row(
                f"{engine.name} every {average_every}",
                {"distribution": engine.name, "average_every": average_every},
            )
        return Row(engine.name, {"distribution": engine.name})

    def scripts(engine):  # (name, script) of its step and its scripts.
        return [(engine.name, ""), *engine.scripts]

    return [
        *(
            Row(f"{engine.name}, buckets of {mib:g} MiB",
                {"distribution": engine.name,
                 "all_reduce_pack_bytes": int(mib * 2**20)},
                buckets=True)
            for engine in overlapping
            for mib in bucket_sizes
        ),
        *(plain(engine) for engine in sending),
        *(
            Row(f"{engine.name}, fp16", {"distribution": engine.name,
                                         "gradient_compression": "fp16"},
                True)
            for engine in sending if engine.compresses
        ),
        *(
            Row(f"{engine.name}, packs of {pack_mb}",
                {"distribution": engine.name, **packs}, True)
            for engine in sending if engine.packs
        ),
        *(
            Row(f"{engine.name}, accumulate 4",
                {"distribution": engine.name, "accumulate_steps": 4}, True)
            for engine in overlapping[:1]
        ),
        *(
            row
            for engine in overlapping
            for row in (
                Row(f"{engine.name}, one {engine.one_all_reduce}",
                    {"distribution": engine.name,
                     "overlap_all_reduce": False},
                    overlap=True),
                *(Row(name, {"distribution": engine.name}, overlap=True,
                      script=script)
                  for name, script in engine.scripts),
            )
        ),
        # A second inter-op thread, as TensorFlow's default gives a node
        # of more than one core: the all-reduce's ops need not wait for
        # the backward pass's on the one thread.
        *(
            Row(f"{name}, 2 inter-op threads",
                {"distribution": engine.name},
                overlap=True, script=script, inter_op_threads=2)
            for engine in overlapping
            for name, script in scripts(engine)
        ),
    ]  # fmt: skip


class ModelJobs:
    """The jobs of one model's run, on the cluster's nodes."""

    def __init__(self, cluster, model, args, log):
        self.cluster = cluster
        self.model = model
        self.args = args
        self.log = log
        self.batch = args.batch.get(model, 32)
        self.base = {
            "model": model,
            "inter_op_threads": args.inter_op_threads,
            "warmup_steps": args.warmup_steps,
            "steps": args.steps,
            "blocks": args.blocks,
        }

    def spec(self, flags, processes, extra=None):
        return {
            **self.base,
            "flags": flags,
            # Accumulation keeps each micro-batch at `batch`.
            "global_batch": self.batch
            * processes
            * flags.get("accumulate_steps", 1),
            **(extra or {}),
        }

    @staticmethod
    def described(flags, extra):
        """The flags, and what a row's own job spec adds (`Row.job_spec`)."""
        own = [f"{k}={extra[k]}" for k in Row.SPEC_KEYS if (extra or {}).get(k)]
        return f"{flags}" + (f" ({', '.join(own)})" if own else "")

    def job(self, flags, nodes, extra=None):
        processes = 1 if registry.get(flags["distribution"]).serve else nodes
        self.log(f"  {self.model} {self.described(flags, extra)} on {nodes} "
                 "node(s) ...")  # fmt: skip
        spec = self.spec(flags, processes, extra)
        return Job(self.cluster, spec, nodes).run()

    def twin(self, flags, extra=None):
        """Two 1-node jobs at once, one per core.

        The step of one node whose neighbour computes too, as in every
        2-node run here (two nodes of this machine share its caches and
        memory; real ones do not). A synchronous step waits for the slower
        node: its median is the row's 1-node step.
        """
        self.log(f"  {self.model} {self.described(flags, extra)} on 1 node, "
                 "twice at once ...")  # fmt: skip
        spec = self.spec(flags, 1, extra)
        jobs = [Job(self.cluster, spec, 1, n) for n in (0, 1)]
        try:
            chiefs = [j.start() for j in jobs]
            runs = [Job.collect(chief) for chief in chiefs]
        finally:
            self.cluster.stop_processes()
        slower = max(runs, key=lambda run: statistics.median(run["step_s"]))
        return {
            "step_s": slower["step_s"],
            "process_cpu_s": slower.get("process_cpu_s"),
            "inter_op_threads": slower["inter_op_threads"],
            "each_node_s": [statistics.median(r["step_s"]) for r in runs],
            "paired_s": paired_slower(
                *(run["each_step_s"] for run in runs),
                flags.get("average_every", 1),
            ),
            "slower_mean_s": max(
                statistics.fmean(run["each_step_s"]) for run in runs
            ),
        }


def calibrate(jobs, network):
    """The slow-down, the shaped link, iperf3 and the all-reduce sweeps.

    All before any row's job: what the rows' predictions may use.
    """
    cluster, model, log = jobs.cluster, jobs.model, jobs.log
    # The 1-node Horovod step sets the slow-down (no network in it).
    cluster.shape(UNSHAPED_MBIT)
    reference = jobs.job({"distribution": "horovod"}, 1)
    cpu_step = statistics.median(reference["step_s"])
    slowdown = cpu_step / (scaling.GPU_STEPS[model].ms / 1e3)
    # Unshaped: the links as fast as the machine moves bytes (the
    # all-reduce's cost in software alone).
    rate = UNSHAPED_MBIT if network is None else network.gbit * 1e3 / slowdown
    cluster.shape(rate)
    goodput = check_link(cluster)
    log(f"  {model}: CPU step {1e3 * cpu_step:.0f} ms, s = {slowdown:.1f}, "
        f"link {rate:.1f} Mbit/s, iperf3 {goodput:.1f}")  # fmt: skip
    n = reference["gradient_bytes"]
    result = {
        "model": model,
        "batch_per_process": jobs.batch,
        "bucket_bytes": traffic.DEFAULT_BUCKET_BYTES,
        "inter_op_threads": jobs.args.inter_op_threads,
        "network": UNSHAPED if network is None else network.name,
        "cpu_step_s": cpu_step,
        "slowdown": slowdown,
        "link_mbit": rate,
        "iperf3_mbit": goodput,
        "gradient_bytes": n,
        "tensors": reference["tensors"],
        "state_bytes": reference["state_bytes"],
        "sweeps": {},
        "sweep_cpu_s": {},
        "rows": [],
        "prediction_sha256": [],
    }
    sizes = sorted({4096, 65536, n // 16, n // 4, n, 2 * n})
    for transport, knobs in transports(jobs.args).items():
        engine = transport.split("+")[0]
        for processes in (2, 4):
            run = jobs.job(
                {"distribution": engine, **knobs},
                processes,
                {"sweep": sizes, "sweep_repeats": jobs.args.sweep_repeats,
                 "steps": 1, "blocks": 1, "warmup_steps": 1},
            )  # fmt: skip
            result["sweeps"][f"{transport} {processes}"] = run["sweep"]
            result["sweep_cpu_s"][f"{transport} {processes}"] = run[
                "sweep_cpu_s"
            ]
    return result


def transports(args):
    """`{transport: flags}` of the sweeps the run's rows need."""
    wanted = args.only.split(",") if args.only else None
    needed = wanted and {registry.get(e).transport.name for e in wanted}
    swept = [e for e in registry.across_nodes() if e.overlaps]
    every = {e.transport.name: {} for e in swept}
    if args.knobs:
        fp16 = {"gradient_compression": "fp16"}
        every.update({f"{e.transport.name}+fp16": fp16 for e in swept})
    return {
        transport: knobs
        for transport, knobs in every.items()
        if not needed or transport.split("+")[0] in needed
    }


def selected_rows(args):
    """The rows of the run, as its flags choose them."""
    wanted = args.only.split(",") if args.only else None

    def chosen(row):
        if wanted and row.engine not in wanted:
            return False
        overlaps = registry.get(row.engine).overlaps
        engine_row = not (row.knob or row.overlap or row.buckets)
        if args.bucket_sizes:  # Their default bucket size, and others.
            return row.buckets or (overlaps and engine_row)
        if args.overlap:  # The engines that overlap, and their controls.
            return row.overlap or (overlaps and engine_row)
        return engine_row or (row.knob and args.knobs)

    sizes = [float(m) for m in args.bucket_sizes.split(",") if m]
    every_row = rows(args.average_every, args.pack_bytes, sizes)
    return [row for row in every_row if chosen(row)]


def single_node_jobs(jobs, row, runs, rate):
    """A row's 1-node jobs of one round, appended to `runs`.

    parameter_server's row also runs its jobs on unshaped links, on 1
    node and on 2: its step without the network (`predict_row`). They
    run here, before the round's predictions: no network, no job the
    predictions are scored against.
    """
    if not registry.get(row.engine).asynchronous:
        runs["1"].append(jobs.twin(row.flags, row.job_spec))
        return
    runs["1"].append(jobs.job(row.flags, 1))
    jobs.cluster.shape(UNSHAPED_MBIT)
    for nodes in (1, 2):
        unshaped = runs.setdefault(f"{nodes} unshaped", [])
        unshaped.append(jobs.job(row.flags, nodes))
    jobs.cluster.shape(rate)


def two_node_job(jobs, row):
    """A row's 2-node job.

    The synchronous engines' plain rows also time their step's
    all-reduces alone (`communication_alone`), and Horovod's its step
    without them (`compute_alone`).
    """
    own = row.job_spec
    plain = row.flags == {"distribution": row.engine} and not own
    ps = registry.get(row.engine).asynchronous
    extra = {"communication_alone": plain and not ps, **own}
    return jobs.job(row.flags, 2, extra)


def measure_model(cluster, model, args, network, log, predictions):
    """Every measurement of one model, as a dict (the `--out` file's).

    Rounds: every row once per round, in alternating order, so that a
    drift of the machine's speed touches all rows alike; each round's job
    is one sample of the row's step. In each round every row's 1-node jobs
    run first; then the round's predictions of every 2-node step are
    written (`predictions`, a `PredictionsFile`) and only then do the
    2-node jobs start.
    """
    jobs = ModelJobs(cluster, model, args, log)
    result = calibrate(jobs, network)
    selected = selected_rows(args)
    runs = {row.name: {"1": [], "2": []} for row in selected}
    gradients = gradients_of(model)
    for round_ in range(args.rounds):
        log(f"  {model}: round {round_ + 1} of {args.rounds}")
        order = selected if round_ % 2 == 0 else selected[::-1]
        for row in order:
            single_node_jobs(jobs, row, runs[row.name], result["link_mbit"])
        entry = predict_round(result, selected, runs, round_, gradients)
        predictions.add(entry)
        result["prediction_sha256"].append(entry["sha256"])
        for row in order:
            runs[row.name]["2"].append(two_node_job(jobs, row))
    result["rows"] = [summarise(row, runs[row.name]) for row in selected]
    return result


def summarise(row, runs):
    """A row as saved: each node count's rounds, medians and extras."""
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
    return measured


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
    engine = registry.get(flags["distribution"])
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
    engine = registry.get(flags["distribution"]).transport.name
    fp16 = flags.get("gradient_compression") == "fp16"
    return f"{engine}+fp16" if fp16 else engine


def cpu_fits_of(result):
    """`{transport: fit}` of the chief's CPU time per all-reduce, 2 processes.

    From the sweeps (`sweep`), fitted per call and per byte
    (`scaling_score.fit_cpu`).
    """
    fits = {}
    for key, sweep_cpu in result.get("sweep_cpu_s", {}).items():
        transport, processes = key.split()
        if processes == "2":
            fits[transport] = scaling_score.fit_cpu(
                [(int(n), cpu) for n, cpu in sweep_cpu.items()]
            )
    return fits


def communication_cpu(cpu_fit, knobs, gradients):
    """CPU time per update a row's all-reduces cost a node's one core.

    Overlapped on a node of one core, the all-reduce's CPU work (Gloo's or
    gRPC's threads, the kernel's TCP) runs between the backward pass's
    ops, not beside them, so the prediction adds it to the step (a GPU
    node's CPU does it beside the GPU's computation). It is estimated
    from what is known before the row's 2-node jobs: the transport's
    CPU time per all-reduce in the sweeps (`cpu_fits_of`), for the row's
    buckets and bytes. Not from the 2-node job's own CPU time less the
    1-node job's, as the model took it before: that is a measurement of
    the job being predicted, and a prediction scored on it is a fit.
    """
    calls = len(gradients.buckets(knobs.pack_bytes)) if knobs.pack_bytes else 1
    return scaling_score.communication_cpu(cpu_fit, gradients.nbytes, calls)


def threads_of(result, row):
    """The inter-op threads of a row's processes.

    Runs saved before rows recorded them: the row's flag, else the run's.
    """
    return (
        row.get("inter_op_threads")
        or row["flags"].get("inter_op_threads")
        or result.get("inter_op_threads", 1)
    )


def predict_row(result, row, one, gradients, unshaped=None):
    """The model's 2-node step of a row whose 1-node step is `one`.

    Args:
      result: the model's calibration (`calibrate`: the link, the sweeps).
      row: `{"name", "flags", "script", "inter_op_threads"}`.
      one: the row's 1-node step, seconds.
      gradients: the model's `traffic.Gradients` (`gradients_of`).
      unshaped: parameter_server's steps on unshaped links, 1 node and 2.

    Returns:
      `(seconds, the communication's CPU time added to them)`.
    """
    flags = row["flags"]
    engine = registry.get(flags["distribution"])
    if engine.traffic is traffic.PUSH_PULL:
        # One worker's pull and push: its 1-node step less the same job's
        # on unshaped links. The step without the network on two nodes is
        # the 2-node job's on unshaped links, as the twin 1-node jobs are
        # the synchronous engines': here the two workers, the ps and the
        # coordinator share the machine's two cores (the workers, unpinned,
        # each compute on both when alone), which on a cluster they do not.
        fit = scaling.RingFit(
            0, 0, 2 * result["gradient_bytes"] / (one - unshaped[0])
        )
        base = 2 * unshaped[1]  # A worker's step: two per update.
        step = scaling.predict_two_nodes(
            engine, knobs_of(flags), base, fit, gradients
        )
        return step, 0.0
    transport = transport_of(flags)
    knobs = knobs_of(
        flags, row.get("script", ""), result["bucket_bytes"],
        threads_of(result, row),
    )  # fmt: skip
    step = scaling.predict_two_nodes(
        engine, knobs, one, fits_of(result)[transport], gradients
    )
    cpu = 0.0
    if engine.overlaps and knobs.overlap:
        cpu = communication_cpu(
            cpu_fits_of(result)[transport], knobs, gradients
        )
    return step + cpu, cpu


def asynchronous(row):
    """Whether a saved row's engine is asynchronous (parameter_server)."""
    return registry.get(row["flags"]["distribution"]).asynchronous


def predict_round(result, selected, runs, round_, gradients):
    """One round's predictions of every 2-node step, from its 1-node jobs.

    Inputs: the calibration (`calibrate`: link, iperf3, sweeps), each
    row's 1-node jobs of the round (parameter_server's on unshaped links
    too), the model's layer table and the rows' knobs. Returns the entry
    the predictions file holds (`scaling_score.prediction_entry`).
    """
    known = {}
    for row in selected:
        samples = runs[row.name]

        def step(key, samples=samples):
            return statistics.median(samples[key][round_]["step_s"])

        known[row.name] = {
            "name": row.name,
            "flags": row.flags,
            "script": row.script,
            "inter_op_threads": samples["1"][round_]["inter_op_threads"],
            "1": {"rounds": [step("1")]},
        }
        if "1 unshaped" in samples:
            known[row.name]["unshaped_s"] = [
                step(f"{n} unshaped") for n in (1, 2)
            ]
    best = scaling_score.best_single_node(list(known.values()), asynchronous)
    predictions = []
    for name, row in known.items():
        one = row["1"]["rounds"][0]
        two, cpu = predict_row(
            result, row, one, gradients, row.get("unshaped_s")
        )
        predicted = {**row, "2": {"rounds": [two]}}
        efficiency = scaling_score.efficiency(
            predicted, best, asynchronous(row)
        )[0]
        predictions.append({
            "row": name, "one_node_s": one, "two_nodes_s": two,
            "communication_cpu_s": cpu, "efficiency": efficiency,
            "against": "own 1-node job" if asynchronous(row)
            else "best single node",
        })  # fmt: skip
    inputs = prediction_inputs(result, known, best)
    return scaling_score.prediction_entry(
        result["model"], round_, inputs, predictions
    )


def prediction_inputs(result, known, best):
    """What a round's predictions were made from, saved beside them."""
    return {
        "link_mbit": result["link_mbit"],
        "iperf3_mbit": result["iperf3_mbit"],
        "gradient_bytes": result["gradient_bytes"],
        "bucket_bytes": result["bucket_bytes"],
        "ring_fits": {
            t: dataclasses.asdict(f) for t, f in fits_of(result).items()
        },
        "cpu_fits": cpu_fits_of(result),
        "best_single_node": {"step_s": best[0][0], "row": best[0][1]}
        if best
        else None,
        "rows": known,
    }


class PredictionsFile:
    """The predictions file of a run, rewritten as each round's is added."""

    def __init__(self, path, log):
        self.path = path
        self.log = log
        self.entries = []

    def add(self, entry):
        """Writes `entry` with those before it and logs its hash."""
        self.entries.append(entry)
        scaling_score.write_predictions(self.path, self.entries)
        self.log(
            f"  {entry['model']}: round {entry['round'] + 1}'s predictions "
            f"written to {self.path} at {entry['written']}, sha256 "
            f"{entry['sha256']}; now the 2-node jobs"
        )


def report(results, predictions=None):
    """The Markdown tables of `results` (the `--out` file).

    `predictions`: the entries of its predictions file, as written before
    the 2-node jobs (`scaling_score.read_predictions`); None for a run
    saved before the bench wrote them.
    """
    lines = [f"{results['cpu']}, {results['date']}", ""]
    for result in results["models"]:
        fits = fits_of(result)
        lines += report_calibration(result, fits)
        lines += report_efficiency(result)
        lines += report_predictions(result, predictions)
        lines += report_stragglers(result)
        lines += report_cpu(result)
        lines += report_ps_network(result)
        lines += report_ps_cpu(result, results.get("cores", 2))
        lines += report_averaging(result, fits)
        lines += report_communication(result)
        lines.append("")
    return "\n".join(lines)


def report_calibration(result, fits):
    """The link, the all-reduce sweeps and the ring fits."""
    link = result["link_mbit"] * 1e6 / 8
    lines = [
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
        "| all-reduce | size MB | measured ms | fit ms | error | CPU ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, sweep in result["sweeps"].items():
        transport, processes = key.split()
        cpu = result.get("sweep_cpu_s", {}).get(key, {})
        for nbytes, seconds in sweep.items():
            fitted = fits[transport](int(nbytes), int(processes))
            lines.append(
                f"| {transport}, {processes} processes | "
                f"{int(nbytes) / 1e6:.3f} | {1e3 * seconds:.1f} | "
                f"{1e3 * fitted:.1f} | "
                f"{100 * (fitted / seconds - 1):+.0f}% | "
                + (f"{1e3 * cpu[nbytes]:.1f} |" if nbytes in cpu else "- |")
            )
    lines += ["", "| transport | c ms | a ms | B MB/s | B / link | "
              "CPU per call ms | CPU per MB ms |",
              "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    cpu_fits = cpu_fits_of(result)
    for transport, fit in fits.items():
        cpu = cpu_fits.get(transport)
        lines.append(
            f"| {transport} | {1e3 * fit.c:.2f} | {1e3 * fit.a:.3f} | "
            f"{fit.bandwidth / 1e6:.1f} | {fit.bandwidth / link:.2f} | "
            + (
                f"{1e3 * cpu['per_call_s']:.2f} | "
                f"{1e9 * cpu['per_byte_s']:.2f} |"
                if cpu
                else "- | - |"
            )
        )
    return lines


def report_efficiency(result):
    """Each row's efficiency against the best single node of the run."""
    rows = result["rows"]
    best = scaling_score.best_single_node(rows, asynchronous)
    lines = [
        "",
        "Efficiency: 2-node throughput over twice the best 1-node "
        "throughput of the run, each round's (the fastest 1-node job per "
        "micro-batch of any synchronous row, whatever its threads or "
        "engine): "
        + "; ".join(f"{1e3 * s:.0f} ms ({name})" for s, name in best)
        + ". A row is its median over the rounds (min-max). "
        "parameter_server: against its own 1-node job, in updates per "
        "second (that job runs a ps and a coordinator beside its worker, "
        "not one node alone). The last column, against the row's own "
        "1-node step, is not what a user compares with.",
        "",
        "| row | inter-op threads | 1 node ms | 2 nodes ms, each round | "
        "efficiency, each round | **efficiency** | against its own "
        "1-node step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        each = scaling_score.efficiency(row, best, asynchronous(row))
        own = scaling_score.spread(scaling_score.own_efficiency(
            row, asynchronous(row)
        ))  # fmt: skip
        middle, low, high = scaling_score.spread(each)
        lines.append(
            f"| {row['name']} | {row.get('inter_op_threads', '-')} | "
            f"{1e3 * row['1']['step_s']:.0f} | "
            + ", ".join(f"{1e3 * t:.0f}" for t in row["2"].get(
                "rounds", [row["2"]["step_s"]]))
            + f" | {', '.join(f'{100 * e:.0f}%' for e in each)} | "
            f"**{100 * middle:.0f}%** ({100 * low:.0f}-{100 * high:.0f}%)"
            + (" (own)" if asynchronous(row) else "")
            + f" | {100 * own[0]:.0f}% ({100 * own[1]:.0f}-"
            f"{100 * own[2]:.0f}%) |"
        )  # fmt: skip
    return lines


def report_predictions(result, entries):
    """The predictions written before the 2-node jobs, scored."""
    mine = [e for e in entries or () if e["model"] == result["model"]]
    if not mine:
        return [
            "",
            "No predictions of this model's 2-node steps were written "
            "before its 2-node jobs (a run saved before the bench wrote "
            "them): none is scored.",
        ]
    predicted, steps, cpu = {}, {}, {}
    for entry in sorted(mine, key=lambda e: e["round"]):
        for p in entry["predictions"]:
            predicted.setdefault(p["row"], []).append(p["efficiency"])
            steps.setdefault(p["row"], []).append(p["two_nodes_s"])
            cpu.setdefault(p["row"], []).append(p["communication_cpu_s"])
    rows = result["rows"]
    best = scaling_score.best_single_node(rows, asynchronous)
    measured = {
        row["name"]: scaling_score.efficiency(row, best, asynchronous(row))
        for row in rows
    }
    points, within, scored = scaling_score.score(predicted, measured)
    lines = [
        "",
        "Predictions, written before the 2-node jobs (each round's file "
        "entry, hash checked), against the measurements; points: measured "
        "less predicted efficiency, the target within "
        f"±{scaling_score.TARGET_POINTS:g}.",
        "",
        "| row | predicted 2 nodes ms | measured ms | communication CPU "
        "added ms | predicted efficiency | measured | points, each round "
        "| points |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_name = {row["name"]: row for row in rows}
    for name, each in points.items():
        lines.append(
            f"| {name} | {_each(steps[name], 1e3, '.0f')} | "
            f"{_each(scaling_score.rounds_of(by_name[name], '2'), 1e3, '.0f')}"
            f" | {_each(cpu[name], 1e3, '.0f')} | "
            f"{_each(predicted[name], 100, '.0f', '%')} | "
            f"{_each(measured[name], 100, '.0f', '%')} | "
            f"{_each(each, 1, '+.1f')} | "
            f"{statistics.median(each):+.1f} |"
        )
    lines += [
        "",
        f"Within ±{scaling_score.TARGET_POINTS:g} points (a row by its "
        f"median over rounds): {within} of {scored} rows. Written: "
        + "; ".join(
            f"round {e['round'] + 1} at {e['written']}, sha256 "
            f"{e['sha256'][:16]}"
            for e in mine
        )
        + ".",
    ]
    return lines


def _each(values, scale, spec, unit=""):
    """`values` scaled, formatted, each followed by `unit`, joined."""
    return ", ".join(f"{scale * v:{spec}}{unit}" for v in values)


def report_stragglers(result):
    """Each round's 1-node step as the slower node's, and paired."""
    lines = []
    for row in result["rows"]:
        if "paired_s" not in row["1"]:
            continue
        pairs = zip(row["1"]["paired_s"], row["1"]["slower_mean_s"],
                    strict=True)  # fmt: skip
        lines += [
            "",
            f"{row['name']}, stragglers: each round's 1-node step as "
            "the slower node's mean, and as the mean of the slower of "
            "every pair of the two nodes' steps (between all-reduces; "
            "a synchronous step waits for the slower node): "
            + "; ".join(
                f"{1e3 * slower:.0f}, {1e3 * paired:.0f} ms"
                for paired, slower in pairs
            )
            + ".",
        ]
    return lines


def report_cpu(result):
    """The chief's CPU time per step on 1 node and 2, measured after."""
    lines = []
    for row in result["rows"]:
        if not row["2"].get("process_cpu_s"):
            continue
        pairs = list(zip(row["1"]["process_cpu_s"],
                         row["2"]["process_cpu_s"], strict=True))  # fmt: skip
        lines += [
            "",
            f"{row['name']}: the chief's CPU time per step, 1 node and "
            "2 nodes, each round: "
            + "; ".join(f"{1e3 * o:.0f}, {1e3 * t:.0f} ms" for o, t in pairs)
            + "; the difference: "
            + ", ".join(f"{1e3 * max(0.0, t - o):.0f}" for o, t in pairs)
            + " ms (measured with the 2-node jobs, so not a prediction's "
            "input: the predictions estimate it from the sweeps).",
        ]
        if asynchronous(row):
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
    return lines


def report_ps_network(result):
    """parameter_server's pull and push, from its unshaped jobs."""
    lines = []
    link = result["link_mbit"] * 1e6 / 8
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
    return lines


def report_ps_cpu(result, cores):
    """parameter_server's CPU time per update, by process."""
    lines = []
    for row in result["rows"]:
        # Runs saved before only parameter_server's jobs measured it
        # have the CPU time of other chiefs alone.
        if "ps" not in row["2"].get("cpu_s", [{}])[0]:
            continue
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
    return lines


def report_averaging(result, fits):
    """The averaging engine's own all-reduce, against the fit."""
    lines = []
    for row in result["rows"]:
        if "average_s" not in row["2"]:
            continue
        nbytes = result.get("state_bytes", 2 * result["gradient_bytes"])
        fitted = fits[transport_of(row["flags"])](nbytes, 2)
        each = _each(row["2"]["average_s"], 1e3, ".0f")
        lines += [
            "",
            f"{row['name']}: its all-reduce of {nbytes / 1e6:.1f} MB "
            f"(weights, statistics, slots) alone in the 2-node jobs: "
            f"{each} ms (each round's fastest of 3); the fit: "
            f"{1e3 * fitted:.0f} ms.",
        ]
    return lines


def report_communication(result):
    """A step's all-reduces alone, and its computation alone."""
    lines = []
    for row in result["rows"]:
        if "communication_s" not in row["2"]:
            continue
        n = result["gradient_bytes"]
        sizes = result["sweeps"][f"{row['flags']['distribution']} 2"]
        each = _each(row["2"]["communication_s"], 1e3, ".0f")
        lines += [
            "",
            f"{row['name']}: its step's all-reduces alone in the 2-node "
            f"jobs (the gradients as a list of {result['tensors']} "
            f"tensors, then the metrics): {each} ms (each round's "
            f"fastest of 3); the sweep's one tensor of "
            f"{n / 1e6:.2f} MB: {1e3 * sizes[str(n)]:.0f} ms; the 2-node "
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
    return lines


def load_report(path):
    """A saved run and its predictions file, the hashes checked."""
    with open(path) as stream:
        results = json.load(stream)
    logged = [
        h for m in results["models"] for h in m.get("prediction_sha256", [])
    ]
    if not logged:
        return results, None
    predictions = scaling_score.predictions_path(path)
    try:
        return results, scaling_score.read_predictions(predictions, logged)
    except FileNotFoundError:
        sys.exit(
            f"network_scaling: {path} logged predictions, but their file "
            f"{predictions} is missing (keep it beside the --out file)"
        )
    except (KeyError, json.JSONDecodeError) as error:
        sys.exit(f"network_scaling: {predictions}: not a predictions file "
                 f"({error!r})")  # fmt: skip
    except ValueError as error:  # It names the file.
        sys.exit(f"network_scaling: {error}")


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
        print(report(*load_report(args.report)))
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
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    predictions = PredictionsFile(scaling_score.predictions_path(args.out), log)
    with emulated_cluster.EmulatedCluster(5) as cluster:
        for model in args.models.split(","):
            results["models"].append(
                measure_model(cluster, model, args, network, log, predictions)
            )
            with open(args.out, "w") as stream:
                json.dump(results, stream, indent=1)
    print(report(*load_report(args.out)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        run_worker(json.loads(sys.argv[2]))
    elif sys.argv[1:2] == ["--rendezvous"]:
        serve_rendezvous(sys.argv[2])
    else:
        main()

"""The measurement inside a node: one process of a network_scaling job.

`network_scaling.py --worker SPEC` runs `run_worker` (or, for the plain
Horovod script's rows, `run_tape_script`) in each process a job starts
(`network_jobs.Job`); the job's chief prints its timings on one line
after `RESULT`, which the driver reads. `--rendezvous` runs Horovod's
Gloo rendezvous for a Horovod job (`serve_rendezvous`). TensorFlow is
imported inside the functions: the driver imports this module too.
"""

import json
import os
import statistics
import time

import common

from tf_resnet import scaling
from tf_resnet.engines import registry

RESULT = "NETWORK_SCALING_RESULT "
# What each model trains on here: CIFAR models on CIFAR's 32x32 images,
# the ImageNet layout on TinyImageNet's 64x64 with ImageNet's 1000
# classes (the real gradient size).
SHAPES = {"cifar": (32, 10), "imagenet": (64, 1000)}


def model_shape(model):
    family = "imagenet" if model in scaling.IMAGENET_MODELS else "cifar"
    return SHAPES[family]


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

    from tf_resnet.config.settings import make_config

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
    run = common.fixed_batch_step(
        config, mode, size, classes, total_steps=100_000
    )
    model, state = run.model, run.state
    result = {
        **timed_steps(spec, mode, run),
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
        **side_measurements(spec, mode, run, config),
    }
    if mode.is_chief:
        print(RESULT + json.dumps(result), flush=True)
    mode.shutdown()


def timed_steps(spec, mode, run):
    """Seconds per step of `spec`'s timed blocks, after its warm-up steps.

    `run`: `common.fixed_batch_step`'s. Also the CPU time per step of this
    process and, for parameter_server's jobs (`cpu_of`), of each server.
    """
    coordinator = getattr(mode, "coordinator", None)  # parameter_server
    step = 0

    each_step = []  # Of the timed blocks: a synchronous step's spread.

    def block(steps):
        nonlocal step
        start = time.perf_counter()
        for _ in range(steps):
            began = time.perf_counter()
            metrics = run.step(run.iterator)
            step += 1
            mode.after_step(step, run.state)  # averaging: every k steps
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
    timed = {
        "step_s": [s / spec["steps"] for s in seconds],
        # This process's CPU time per step, every thread of it.
        "process_cpu_s": process_cpu / (spec["steps"] * spec["blocks"]),
        "each_step_s": each_step,
        "warmup_s": warmup,
    }
    if sessions:
        timed["cpu_s"] = {
            name: (cpu_after[name] - cpu_before[name])
            / (spec["steps"] * spec["blocks"])
            for name in sessions
        }
    return timed


def side_measurements(spec, mode, run, config):
    """What `spec` asks timed beside the steps, after them.

    The averaging engine's all-reduce, a step's all-reduces alone and
    Horovod's step without them (`communication_alone`), the sweep. The
    calibration's sweep jobs ask for the step's all-reduces alone too
    (`step_all_reduces`): what the predictions start from.
    """
    from tf_resnet.distribute.averaging import float_variables

    result = {}
    if hasattr(mode, "average_in_place"):
        # The averaging engine's own all-reduce (weights, statistics and
        # slots, as `after_step` does), timed alone: what the model's
        # all-reduce of its bytes stands for.
        variables = float_variables(run.state.variables)
        result["average_s"] = []
        for _ in range(3):
            start = time.perf_counter()
            mode.average_in_place(variables)
            result["average_s"].append(time.perf_counter() - start)
    if spec.get("communication_alone") or spec.get("step_all_reduces"):
        fp16 = spec["flags"].get("gradient_compression") == "fp16"
        result["communication_s"] = communication_alone(
            mode, run.model, fp16=fp16
        )
        if spec.get("delayer_pids"):
            result["holding"] = holding_probe(
                mode, run.model, spec["delayer_pids"], fp16
            )
        if spec.get("communication_alone") and mode_is_horovod(mode):
            result["compute_s"] = compute_alone(
                mode, run.model, run.optimizer, config, run.iterator, spec
            )
    if spec.get("sweep"):
        fp16 = spec["flags"].get("gradient_compression") == "fp16"
        result["sweep"], result["sweep_cpu_s"] = sweep(
            mode, spec["sweep"], spec["sweep_repeats"], fp16
        )
    return result


# How long `holding_probe` leaves the transport idle, and how many of a
# step's all-reduces it sends: the delayers' CPU time is read in clock
# ticks (10 ms), so each window holds several of them.
IDLE_PROBE_S = 3.0
PROBE_REPEATS = 5


def holding_probe(mode, model, delayer_pids, fp16=False):
    """What the emulated latency's delayers cost a 2-node job's cores.

    Each node's delayer holds the packets it receives (`emulated_cluster`'s
    `delay`), on the machine's cores, which the nodes' computation loses,
    which on a real network it does not. Read from the delayers' CPU time,
    before any row's jobs: while the transport idles (Horovod's background
    thread still negotiates every cycle) and while it sends a step's
    all-reduces, so that a row's holding is predicted from its bytes and
    its step (`network_predict.holding_seconds`).

    Returns:
      `{"idle_cpu_per_s", "cpu_per_byte"}`: both delayers' CPU seconds per
      second idle, and per gradient byte all-reduced beyond that.
    """
    sessions = {str(pid): pid for pid in delayer_pids}

    def holding():
        return sum(cpu_seconds(sessions).values())

    # Both nodes idle here: they have just ended the same all-reduces.
    held, start = holding(), time.perf_counter()
    time.sleep(IDLE_PROBE_S)
    idle_rate = (holding() - held) / (time.perf_counter() - start)
    held, start = holding(), time.perf_counter()
    communication_alone(mode, model, PROBE_REPEATS, fp16)
    seconds = time.perf_counter() - start
    # Its all-reduces: one untimed before the repeats, then the repeats.
    sent = (PROBE_REPEATS + 1) * sum(
        int(v.shape.num_elements()) * 4 for v in model.trainable_variables
    )
    per_byte = (holding() - held - idle_rate * seconds) / sent
    return {"idle_cpu_per_s": idle_rate, "cpu_per_byte": max(0.0, per_byte)}


def mode_is_horovod(mode):
    """Whether `mode` is Horovod's (which has no `tf.distribute` strategy)."""
    return getattr(mode, "strategy", None) is None


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
    if mode_is_horovod(mode):
        return mode.all_reduce_gradients(local)
    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, local)


def communication_alone(mode, model, repeats=3, fp16=False):
    """Seconds of a step's all-reduces with nothing computed, `repeats` times.

    What a synchronous step sends, sent as it sends it: the gradients as a
    list shaped like the trainable variables (Horovod: the mode's grouped
    all-reduce; multi_worker: the replica context's, as the optimizer's),
    then the metrics. Set beside the sweep's one tensor of the same bytes,
    it tells the cost of the list from the cost of the rest of the step.
    With `fp16`, as `--gradient_compression=fp16` sends them (as `sweep`).
    """
    import tensorflow as tf

    # Horovod's mode compresses by itself; the replica context is handed
    # float16, as the optimizer's compressed all-reduce is.
    dtype = tf.float16 if fp16 and not mode_is_horovod(mode) else tf.float32
    # Arguments, not constants made in the function: Horovod's all-reduce
    # of those came back in 0.3 ms at 2 processes, not done at each call.
    tensors = [tf.ones(v.shape, dtype) for v in model.trainable_variables]

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
    horovod = mode_is_horovod(mode)
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

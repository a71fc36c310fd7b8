"""Scaling on one machine, Horovod and multi_worker: 2 processes vs 1.

  .venv/bin/python bench/scaling.py

Each configuration is a real `horovodrun --gloo` job, started by
`tf_resnet.launch.horovod`, running the training step of
`--distribution=horovod` (`tf_resnet.distribute.horovod_ranks`: one fused
all-reduce of the gradients and one of the step metrics per step) on
a fixed batch of 128 per rank (weak scaling: the global batch grows with
the ranks, the work per rank stays the same). Jobs alternate, one of each
per round, so load from elsewhere hits all alike; a round's sample is the
median of its blocks. Ranks use the project's Horovod settings
(`horovod_ranks.set_cycle_time`: a 5 ms cycle on CPUs); one row keeps
Horovod's own 1 ms to show what that choice moved. A 1-process, 2-thread
run without Horovod is the context row: what the same 2 cores give without
data parallelism.

`--distribution=multi_worker` (TensorFlow's MultiWorkerMirroredStrategy,
no Horovod) runs the same step in the same rounds, 1 and 2 workers
started by `tf_resnet.launch.tf_config_cluster` the way the Horovod jobs are
started by `tf_resnet.launch.horovod`; each engine's 2-process rate is
divided by its own 1-process rate. Without Horovod installed its rows
are the only ones run.

The all-reduce time is measured in the same job: the mode's
`all_reduce_gradients` on tensors shaped like the gradients plus its
metric `reduce_sum`, timed alone, as a fraction of the step. Under
multi_worker the gradients are reduced inside the optimizer, so there
it is one replica-context `all_reduce` of the gradient list (what the
strategy batches into one collective) plus the same `reduce_sum`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import train_step  # noqa: E402

from tf_resnet.engines import registry, startup  # noqa: E402

RESULT = "SCALING_RESULT "


def run_rank(spec):
    """One rank (or the plain process): time steps and the all-reduce."""
    import tensorflow as tf

    from tf_resnet import builders, train_loop
    from tf_resnet.config.settings import make_config
    from tf_resnet.distribute.base import TrainState

    engine = registry.get(spec["distribution"])
    ranks = startup.processes_in_sync(engine)
    data = common.DATA["cifar10"]
    config = make_config(
        train_data_path=data["path"],
        model=spec["model"],
        batch_size=spec["batch"] * ranks,
        intra_op_threads=spec["threads"],
        inter_op_threads=spec["threads"],
        dtype=spec["dtype"],
        distribution=spec["distribution"],
    )
    mode = common.start_mode(config)
    model = builders.build_model(config, mode, common.training_split("cifar10"))
    optimizer = builders.build_optimizer(
        config, mode, model, total_steps=100_000
    )
    mode.broadcast_initial_state(TrainState(model, optimizer))
    step = mode.make_train_step(
        train_loop.make_replica_fn(model, optimizer, mode, config)
    )
    batch = train_step._fixed_batch({**spec, "data": "cifar10"})
    iterator = mode.distribute_dataset(
        lambda *_: tf.data.Dataset.from_tensors(batch).repeat()
    )

    def block():
        start = time.perf_counter()
        for _ in range(spec["steps"]):
            metrics = step(iterator)
        mode.fetch(metrics)
        return time.perf_counter() - start

    start = time.perf_counter()
    block()
    warmup = time.perf_counter() - start
    seconds = [block() for _ in range(spec["blocks"])]
    step_s = statistics.median(seconds) / spec["steps"]
    grads = [tf.zeros_like(v) for v in model.trainable_variables]
    scalars = {k: tf.zeros([]) for k in ("loss_sum", "correct", "examples")}

    @tf.function
    def all_reduce(grads, scalars):
        # A tf.distribute engine across processes reduces in a replica.
        if engine.per_process or not engine.traffic:
            reduced = mode.all_reduce_gradients(grads)
            return reduced[0][0], mode.reduce_sum(scalars)

        def replica_fn():
            # Made on the replica's device: the all-reduce sends from there.
            local = [tf.identity(g) for g in grads]
            context = tf.distribute.get_replica_context()
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
            return reduced[0][0], {
                k: tf.identity(v) for k, v in scalars.items()
            }

        first, per_replica = mode.strategy.run(replica_fn)
        return first, mode.reduce_sum(per_replica)

    all_reduce(grads, scalars)
    calls = 50
    start = time.perf_counter()
    for _ in range(calls):
        result = all_reduce(grads, scalars)
    tf.nest.map_structure(lambda t: t.numpy(), result)
    reduce_s = (time.perf_counter() - start) / calls
    if mode.is_chief:
        print(
            RESULT
            + json.dumps(
                {
                    "images_per_sec": [
                        mode.batch.examples(spec["steps"]) / s for s in seconds
                    ],
                    "step_ms": 1e3 * step_s,
                    "allreduce_ms": 1e3 * reduce_s,
                    "warmup_s": warmup,
                    "gradient_mb": sum(g.numpy().nbytes for g in grads) / 1e6,
                }
            ),
            flush=True,
        )
    mode.shutdown()


def run_job(spec, ranks, env):
    """Runs one configuration; returns rank 0's result dict."""
    worker_flags = ["--worker", json.dumps(spec)]
    # The engine's launcher: processes in a loopback-only namespace. The
    # multi_worker one also appends --distribution=multi_worker, which the
    # worker ignores (its spec says so already).
    launcher = f"tf_resnet.launch.{registry.get(spec['distribution']).launcher}"
    if ranks:
        command = [
            sys.executable, "-m", launcher, f"--np={ranks}",
            f"--main={os.path.abspath(__file__)}", "--", *worker_flags,
        ]  # fmt: skip
    else:
        command = [sys.executable, __file__, *worker_flags]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env},
        cwd=common.ROOT,
        timeout=1800,
    )
    for line in (proc.stdout + proc.stderr).splitlines():
        # horovodrun prefixes rank output with "[0]<stdout>:".
        if RESULT in line:
            return json.loads(line.split(RESULT, 1)[1])
    raise RuntimeError(
        f"no result from {' '.join(command[:6])}...:\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch", type=int, default=128, help="per rank")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()
    common.print_environment("Horovod and multi_worker scaling, images/sec")
    base = {
        "model": args.model,
        "batch": args.batch,
        "dtype": args.dtype,
        "steps": args.steps,
        "blocks": args.blocks,
    }
    horovod = {**base, "distribution": "horovod"}
    multi_worker = {**base, "distribution": "multi_worker"}
    # name: (spec, processes (0: no launcher), threads per process,
    # environment, the row its rate is divided by)
    configs = {
        "1 rank x 1 thread": (horovod, 1, 1, {}, "1 rank x 1 thread"),
        "2 ranks x 1 thread": (horovod, 2, 1, {}, "1 rank x 1 thread"),
        "2 ranks x 1 thread, Horovod's 1 ms cycle": (
            horovod,
            2,
            1,
            {"HOROVOD_CYCLE_TIME": "1"},
            "1 rank x 1 thread",
        ),
        "multi_worker, 1 worker x 1 thread": (
            multi_worker,
            1,
            1,
            {},
            "multi_worker, 1 worker x 1 thread",
        ),
        "multi_worker, 2 workers x 1 thread": (
            multi_worker,
            2,
            1,
            {},
            "multi_worker, 1 worker x 1 thread",
        ),
        "1 process x 2 threads, no Horovod": (
            {**base, "distribution": "default"},
            0,
            2,
            {},
            "1 rank x 1 thread",
        ),
    }
    if not registry.installed(registry.HOROVOD):
        print("(no Horovod here: multi_worker and the plain process only)")
        configs = {
            name: (*config[:4], "multi_worker, 1 worker x 1 thread")
            for name, config in configs.items()
            if config[0] is not horovod
        }
    results = {name: [] for name in configs}
    for round_index in range(args.repetitions):
        names = list(configs)
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            spec, ranks, threads, env, _ = configs[name]
            results[name].append(
                run_job({**spec, "threads": threads}, ranks, env)
            )

    print_results(args, configs, results)


def print_results(args, configs, results):
    """The table of every configuration's rounds (`main`'s `configs`)."""

    def rates(name):
        return [statistics.median(r["images_per_sec"]) for r in results[name]]

    rows = []
    for name, runs in results.items():
        step_ms = common.Stats(r["step_ms"] for r in runs)
        reduce_ms = common.Stats(r["allreduce_ms"] for r in runs)
        share = common.Stats(r["allreduce_ms"] / r["step_ms"] for r in runs)
        launched = configs[name][1] > 0
        rows.append(
            [
                name,
                common.Stats(rates(name)).format(),
                common.ratio(rates(name), rates(configs[name][4])).format(2),
                step_ms.format(),
                reduce_ms.format(2) if launched else "-",
                f"{100 * share.median:.1f}%" if launched else "-",
                f"{statistics.median(r['warmup_s'] for r in runs):.1f}",
            ]
        )
    first = next(iter(results.values()))[0]
    common.print_table(
        f"{args.model}, batch {args.batch} per process, gradients "
        f"{first['gradient_mb']:.2f} MB, "
        f"{args.repetitions} rounds x {args.blocks} blocks x {args.steps} "
        f"steps; load {common.load_average():.2f} at end",
        [
            "configuration",
            "images/sec median (min-max)",
            "/ 1 process, same engine",
            "step ms",
            "all-reduce ms",
            "all-reduce / step",
            "warm-up s",
        ],
        rows,
    )


if __name__ == "__main__":
    common.run_script(main, run_rank)

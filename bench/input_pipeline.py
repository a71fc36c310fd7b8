"""Input pipeline speed against the training step, and against torchvision.

  .venv/bin/python bench/input_pipeline.py [--folder=DIR] \
      [--torchvision_python=~/.cache/tf-resnet/bench-torchvision/bin/python]

For each data set (the CIFAR-10 binary sample; a Tiny-ImageNet folder:
the 10-class sample, or `--folder`, e.g. the 200-class, 110,000-image one
that `data/make_synthetic_tinyimagenet.py` writes) the table shows, side
by side in one run:

* `ours: training input`: images/sec of `open_split(..., training=True)
  .dataset(128)` alone (each epoch a permutation of the whole split,
  decoding, crop, flip, the dataset's mean/std: what `train_loop.train`
  builds for the course presets), pulled as fast as possible;
* `torchvision: ImageFolder + DataLoader` (folders, with
  `--torchvision_python`): the same transform, shuffled, as many worker
  processes as this machine has cores, as our pipeline has parallel calls
  (`bench/torchvision_input.py`);
* `ours: evaluation input`: one whole pass over the evaluation split;
* `step (fixed batch)`: images/sec of the training step of the model that
  trains on that data (resnet20 for CIFAR, course_resnet for TinyImageNet)
  on one fixed batch, i.e. what the step could consume;
* `step (real input)`: the same step fed by the training input, as in
  training: both share the cores, so this shows what input really costs.

Besides the rate: `/ step`, the ratio to the step's rate in the same round
(targets: >= 20x CIFAR, >= 3x TinyImageNet; ours >= torchvision);
`start-up s`, from the framework's import to the first batch (listing and
checking the files included), or the step worker's set-up and first step;
`peak RSS MB`, the high-water mark of the worker's processes at the end.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import train_step  # noqa: E402

MODEL_OF = {"cifar10": "resnet20", "tinyimagenet": "course_resnet"}
# Blocks of a few seconds, so batches prefetched while other workers run
# (tf.data and DataLoader keep a few ready) are a small part of a block.
TRAINING_BATCHES = {"cifar10": 400, "tinyimagenet": 120}


def setup_pipeline(spec):
    """Times blocks of `spec['batches']` batches of the training input."""
    from tf_resnet import data  # noqa: F401  # TensorFlow's import: untimed.

    start = time.perf_counter()
    dataset = common.build_training_dataset(
        spec["data"], int(spec["batch"]), normalization="dataset"
    )
    iterator = iter(dataset)
    next(iterator)[0].numpy()
    info = {"first_batch_s": time.perf_counter() - start}
    batches = int(spec["batches"])

    def run_block():
        for _ in range(batches):
            images, _ = next(iterator)
        images.numpy()
        return batches * int(spec["batch"])

    run_block()  # Lets prefetch buffers grow to their size.
    return run_block, info


def setup_evaluation(spec):
    """Times whole passes over the evaluation split."""
    from tf_resnet import data

    start = time.perf_counter()
    source = common.DATA[spec["data"]]
    split = data.open_split(
        source["dataset"], source["eval_path"], training=False
    )
    dataset = split.dataset(
        int(spec["batch"]), data.InputOptions(normalization="dataset")
    )

    def run_block():
        count = 0
        for images, _ in dataset:
            count += int(images.shape[0])
        return count

    next(iter(dataset))[0].numpy()
    info = {"first_batch_s": time.perf_counter() - start}
    run_block()
    return run_block, info


def serve(spec):
    if spec["kind"] == "pipeline":
        common.serve(lambda: setup_pipeline(spec))
    elif spec["kind"] == "evaluation":
        common.serve(lambda: setup_evaluation(spec))
    else:
        train_step.serve(spec)


def torchvision_spec(data_name, batch):
    """The DataLoader worker's settings: our transform's, from our facts."""
    from tf_resnet import data

    facts = data.DATASETS[common.DATA[data_name]["dataset"]]
    return {
        "root": common.DATA[data_name]["path"],
        "batch": batch,
        "batches": TRAINING_BATCHES[data_name],
        "workers": os.cpu_count(),
        "size": facts.image_size,
        "pad": facts.pad,
        "mean": list(facts.mean),
        "std": list(facts.std),
    }


def start_workers(data_name, args, env):
    """The contenders of one data set, each in its own process."""
    step = {
        "kind": "ours",
        "model": MODEL_OF[data_name],
        "data": data_name,
        "batch": args.batch,
        "threads": os.cpu_count(),
        "inter": 0,
        "dtype": args.dtype,
        "xla": 0,
        "ema": 0,
        "steps": args.steps,
    }
    pipeline = {
        "kind": "pipeline",
        "data": data_name,
        "batch": args.batch,
        "batches": TRAINING_BATCHES[data_name],
    }
    workers = []
    try:
        workers.append(
            common.Worker("ours: training input", __file__, pipeline, env)
        )
        if args.torchvision_python and data_name == "tinyimagenet":
            workers.append(
                common.Worker(
                    "torchvision: ImageFolder + DataLoader",
                    os.path.join(
                        os.path.dirname(__file__), "torchvision_input.py"
                    ),
                    torchvision_spec(data_name, args.batch),
                    env,
                    python=os.path.expanduser(args.torchvision_python),
                )
            )
        workers.append(
            common.Worker(
                "ours: evaluation input",
                __file__,
                {"kind": "evaluation", "data": data_name, "batch": args.batch},
                env,
            )
        )
        for name, source in (("fixed batch", "fixed"), ("real input", "real")):
            workers.append(
                common.Worker(
                    f"step ({name})", __file__, {**step, "input": source}, env
                )
            )
    except BaseException:
        common.close_all(workers)
        raise
    return workers


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="cifar10,tinyimagenet")
    parser.add_argument(
        "--folder",
        default="",
        help="A Tiny-ImageNet-layout folder instead of the 10-class sample.",
    )
    parser.add_argument(
        "--torchvision_python",
        default="",
        help="Python of an environment with torchvision: adds its contender.",
    )
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    env = {}
    if args.folder:  # For the workers, and for this process's table.
        folder = os.path.abspath(args.folder)
        env["BENCH_TINYIMAGENET_DIR"] = folder
        common.DATA["tinyimagenet"].update(path=folder, eval_path=folder)
    common.print_environment("input pipelines vs training step, images/sec")
    for data_name in args.data.split(","):
        workers = start_workers(data_name, args, env)
        try:
            rates = common.run_side_by_side(workers, args.repetitions)
            memory = {w.name: w.stats()["peak_rss_mb"] for w in workers}
        finally:
            common.close_all(workers)
        fixed = rates["step (fixed batch)"]
        rows = []
        for worker in workers:
            started = worker.info.get("first_batch_s", worker.info["warmup_s"])
            rows.append(
                [
                    worker.name,
                    common.Stats(rates[worker.name]).format(),
                    common.ratio(rates[worker.name], fixed).format(2),
                    f"{started:.1f}",
                    f"{memory[worker.name]:.0f}",
                ]
            )
        split = common.training_split(data_name)
        common.print_table(
            f"{data_name} ({split.source}: {common.DATA[data_name]['path']}, "
            f"{split.num_examples} training images, {split.num_classes} "
            f"classes), {MODEL_OF[data_name]}, batch {args.batch}, "
            f"{args.repetitions} rounds; load {common.load_average():.2f} "
            "at end",
            [
                "contender",
                "images/sec median (min-max)",
                "/ step (fixed batch)",
                "start-up s",
                "peak RSS MB",
            ],
            rows,
        )


if __name__ == "__main__":
    common.run_script(main, serve)

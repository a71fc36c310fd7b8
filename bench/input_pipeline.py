"""Input pipeline speed against the speed the training step consumes it.

  .venv/bin/python bench/input_pipeline.py

For each real data sample (CIFAR-10 binary, cached in memory and repeated;
the 10-class TinyImageNet JPEG folders, decoded every epoch) the table shows,
side by side in one run:

* `pipeline`: images/sec of `open_split(..., training=True).dataset()` at
  batch 128 alone (shuffle, augmentation, standardisation; what
  `train_loop.train` builds), pulled as fast as possible;
* `step (fixed batch)`: images/sec of the training step of the model that
  trains on that data (resnet20 for CIFAR, course_resnet for TinyImageNet)
  on one fixed batch, i.e. what the step could consume;
* `step (real input)`: the same step fed by the pipeline, as in training:
  both share the 2 cores, so this shows what input really costs.

The headroom `pipeline / step` is the result (targets: >= 20x CIFAR,
>= 3x TinyImageNet).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import train_step  # noqa: E402

MODEL_OF = {"cifar10": "resnet20", "tinyimagenet": "course_resnet"}


def setup_pipeline(spec):
    """Times blocks of `spec['batches']` batches of the training pipeline."""
    dataset = common.build_training_dataset(spec["data"], int(spec["batch"]))
    iterator = iter(dataset)
    batches = int(spec["batches"])

    def run_block():
        for _ in range(batches):
            images, _ = next(iterator)
        images.numpy()
        return batches * int(spec["batch"])

    # Fills the cache (CIFAR) and lets tf.data's autotuner settle.
    start = time.perf_counter()
    run_block()
    first = time.perf_counter() - start
    run_block()
    return run_block, {"first_block_s": first}


def serve(spec):
    if spec["kind"] == "pipeline":
        common.serve(lambda: setup_pipeline(spec))
    else:
        train_step.serve(spec)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="cifar10,tinyimagenet")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    common.print_environment("input pipeline vs training step, images/sec")
    for data_name in args.data.split(","):
        model = MODEL_OF[data_name]
        step = {
            "kind": "ours",
            "model": model,
            "data": data_name,
            "batch": args.batch,
            "threads": os.cpu_count(),
            "inter": 0,
            "dtype": args.dtype,
            "xla": 0,
            "steps": args.steps,
        }
        pipeline = {
            "kind": "pipeline",
            "data": data_name,
            "batch": args.batch,
            # Blocks of ~2 s, so batches prefetched while other workers run
            # (tf.data keeps a few ready) are a small part of a block.
            "batches": 400 if data_name == "cifar10" else 120,
        }
        workers = []
        try:
            workers.append(common.Worker("pipeline", __file__, pipeline))
            workers.append(
                common.Worker(
                    "step (fixed batch)", __file__, {**step, "input": "fixed"}
                )
            )
            workers.append(
                common.Worker(
                    "step (real input)", __file__, {**step, "input": "real"}
                )
            )
            rates = common.run_side_by_side(workers, args.repetitions)
        finally:
            common.close_all(workers)
        fixed = rates["step (fixed batch)"]
        rows = [
            common.worker_row(
                worker, rates, common.ratio(rates[worker.name], fixed)
            )
            for worker in workers
        ]
        common.print_table(
            f"{data_name} ({common.training_split(data_name).source}), "
            f"{model}, batch {args.batch}, {args.repetitions} rounds; load "
            f"{common.load_average():.2f} at end",
            [
                "contender",
                "images/sec median (min-max)",
                "/ step (fixed batch)",
                "warm-up s",
            ],
            rows,
        )


if __name__ == "__main__":
    common.run_script(main, serve)

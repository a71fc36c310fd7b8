"""What opening a split costs: listing and checking its files once.

  .venv/bin/python bench/open_split.py

For each split of the real data samples, the seconds of
`data.open_split` (the CIFAR binary record and label check; the
TinyImageNet folder listing and the JPEG start/end marker check of every
image). The first open of a process may read from disk; the median of the
following ones reads from the page cache. Opening does no TensorFlow work,
so one process and a few repetitions are enough.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def seconds_to_open(name, training):
    from tf_resnet import data

    info = common.DATA[name]
    path = info["path"] if training else info["eval_path"]
    start = time.perf_counter()
    split = data.open_split(info["dataset"], path, training=training)
    return time.perf_counter() - start, split


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    common.print_environment("opening a split, seconds")
    rows = []
    for name in common.DATA:
        for training in (True, False):
            first, split = seconds_to_open(name, training)
            warm = [
                seconds_to_open(name, training)[0]
                for _ in range(args.repetitions)
            ]
            kind = "train" if training else "eval"
            rows.append(
                [
                    f"{name} {kind} ({split.source})",
                    split.num_examples,
                    f"{first:.3f}",
                    common.Stats(warm).format(3),
                ]
            )
    common.print_table(
        f"open_split, {args.repetitions} repetitions after the first; load "
        f"{common.load_average():.2f} at end",
        ["split", "examples", "first open s", "then median (min-max) s"],
        rows,
    )


if __name__ == "__main__":
    main()

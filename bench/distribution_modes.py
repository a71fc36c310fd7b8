"""The same model and budget under every distribution mode, side by side.

  .venv/bin/python bench/distribution_modes.py [--epochs=3] [--model=resnet20]

Trains `--model` on the real CIFAR-10 sample in $BENCH_DATA_DIR (as the
other benchmarks: bench/common.py; or `--data_dir`) once per mode
through the real entry points (resnet_main.py, horovodrun, the
multi_worker and parameter-server launchers), with the same global batch,
epochs, schedule and seed, and prints images/sec (median of the progress
lines after the first), final test accuracy (last row of eval.csv) and
wall time. On a 2-core machine the multi-process modes share the same two
cores, so this shows overheads and correctness, not multi-machine
speed-ups.
"""

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CIFAR_DIR, ROOT, cpu_model  # noqa: E402

PYTHON = sys.executable


def modes():
    """`(name, command prefix, extra flags)` of each mode."""
    main = [PYTHON, os.path.join(ROOT, "resnet_main.py")]
    # Both launchers keep their ranks/tasks in a loopback-only namespace.
    hvd = [PYTHON, "-m", "tf_resnet.launch.horovod", "--np=2", "--"]
    launcher = [PYTHON, "-m", "tf_resnet.launch.ps"]
    # It adds --distribution=multi_worker itself.
    multi_worker = [
        PYTHON, "-m", "tf_resnet.launch.tf_config_cluster", "--np=2"
    ]  # fmt: skip
    return [
        ("single process", main, ["--distribution=default"]),
        ("mirrored (2 CPU devices)", main, ["--cpu_replicas=2"]),
        ("horovod (2 ranks)", hvd, ["--distribution=horovod"]),
        ("multi_worker (2 workers, no Horovod)", [*multi_worker, "--"], []),
        (
            "averaging (2 ranks, every 10 steps)",
            hvd,
            # Each rank's update uses half the batch: the documented rule
            # multiplies the rate by the rank count to match sync SGD.
            [
                "--distribution=averaging",
                "--average_every=10",
                "--learning_rate=0.2",
            ],
        ),
        (
            "parameter server (1 ps + 2 workers)",
            [*launcher, "--num_ps=1", "--num_workers=2", "--"],
            # Async updates with momentum 0.9 diverge on small runs
            # (docs/parameter_server.md); the global batch is per update.
            ["--momentum=0.5"],
        ),
    ]


def run_mode(name, prefix, extra, shared_flags, log_root):
    """Runs one mode; returns its row of the table."""
    start = time.time()
    proc = subprocess.run(
        [*prefix, *shared_flags, f"--log_root={log_root}", *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    wall = time.time() - start
    output = proc.stdout + proc.stderr
    if proc.returncode:
        tail = "\n".join(output.splitlines()[-15:])
        return {"mode": name, "error": f"exit {proc.returncode}:\n{tail}"}
    speeds = [float(v) for v in re.findall(r"([\d.]+) images/sec", output)][1:]
    with open(os.path.join(log_root, "eval.csv"), newline="") as stream:
        rows = list(csv.DictReader(stream))
    return {
        "mode": name,
        "images_per_sec": statistics.median(speeds) if speeds else 0.0,
        "accuracy": float(rows[-1]["precision"]),
        "best": max(float(r["precision"]) for r in rows),
        "wall": wall,
    }


def main():
    """Runs every mode in turn and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=CIFAR_DIR)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated substrings of the mode names to run",
    )
    args = parser.parse_args()
    shared_flags = [
        "--dataset=cifar10",
        f"--train_data_path={args.data_dir}/data_batch*",
        f"--eval_data_path={args.data_dir}/test_batch.bin",
        f"--model={args.model}",
        f"--batch_size={args.batch_size}",
        f"--train_epochs={args.epochs}",
        "--log_every_steps=10",
        "--seed=1",
    ]
    print(
        f"== {args.model}, {args.epochs} epochs, global batch "
        f"{args.batch_size}, data {args.data_dir}; {cpu_model()}, "
        f"{os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, (name, prefix, extra) in enumerate(modes()):
            wanted = [part for part in args.only.split(",") if part]
            if wanted and not any(part in name for part in wanted):
                continue
            log_root = os.path.join(scratch, f"mode{index}")
            rows.append(run_mode(name, prefix, extra, shared_flags, log_root))
            print(f"   done: {name}", file=sys.stderr, flush=True)
    print(
        f"{'mode':38} {'images/sec':>10} {'test acc':>9} {'best':>6} "
        f"{'wall s':>7}"
    )
    for row in rows:
        if "error" in row:
            print(f"{row['mode']:38} FAILED {row['error']}")
            continue
        print(
            f"{row['mode']:38} {row['images_per_sec']:10.1f} "
            f"{row['accuracy']:9.4f} {row['best']:6.4f} {row['wall']:7.1f}"
        )


if __name__ == "__main__":
    main()

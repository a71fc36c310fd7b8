"""Peak memory of real training runs and how it grows with the batch.

  .venv/bin/python bench/memory.py

Each row is a short `resnet_main.py` training run (ResNet-56 on the CIFAR-10
sample, `--train_steps` steps and one evaluation batch at the end) in its
own process; its peak resident set size comes from the kernel
(`os.wait4`'s rusage of exactly that child). The fit `MB per image` is the
slope between the smallest and largest batch: activation memory kept for
the backward pass, what a bigger batch costs. Memory does not depend on the
load of the machine, so one run per row is enough.
"""

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def peak_rss_mb(args):
    """Runs resnet_main.py with `args`; returns its peak RSS in MB."""
    with tempfile.TemporaryDirectory(prefix="bench_memory_") as log_root:
        command = [
            sys.executable,
            os.path.join(common.ROOT, "resnet_main.py"),
            f"--log_root={log_root}",
            *args,
        ]
        proc = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            cwd=common.ROOT,
        )
        # wait4 reports this child's own peak, not the maximum over all
        # children as getrusage(RUSAGE_CHILDREN) would.
        _, status, usage = os.wait4(proc.pid, 0)
        stderr = proc.stderr.read()
        proc.stderr.close()
        if os.waitstatus_to_exitcode(status):
            raise RuntimeError(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
    return usage.ru_maxrss / 1024  # Linux reports KB.


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet56")
    parser.add_argument("--batches", default="32,64,128,256")
    parser.add_argument("--dtypes", default="auto,float32")
    parser.add_argument("--train_steps", type=int, default=10)
    args = parser.parse_args()
    common.print_environment("peak RSS of training runs")
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for dtype in args.dtypes.split(","):
        peaks = []
        for batch in batches:
            peaks.append(
                peak_rss_mb(
                    [
                        "--dataset=cifar10",
                        f"--train_data_path={common.DATA['cifar10']['path']}",
                        "--eval_data_path="
                        + os.path.join(common.CIFAR_DIR, "test_batch.bin"),
                        f"--model={args.model}",
                        f"--batch_size={batch}",
                        f"--train_steps={args.train_steps}",
                        "--eval_batch_count=1",
                        f"--dtype={dtype}",
                    ]
                )
            )
        slope = (peaks[-1] - peaks[0]) / (batches[-1] - batches[0])
        rows.append([dtype, *(f"{p:.0f}" for p in peaks), f"{slope:.2f}"])
    common.print_table(
        f"{args.model}, peak RSS in MB by global batch size "
        f"({args.train_steps} steps + 1 eval batch); load "
        f"{common.load_average():.2f} at end",
        ["--dtype", *(f"batch {b}" for b in batches), "MB per image"],
        rows,
    )


if __name__ == "__main__":
    main()

"""What the stop check costs a step: `any_process_stopping` on and off.

Two processes of each engine train ResNet-8 (the tests' model, batch 32
global) on generated CIFAR-10 records over loopback, through the
one-machine launchers. The loop asks `mode.any_process_stopping` after
every step (`stop_check_every_steps` set to 1 here); in alternate blocks of
10 steps the wrapper below runs the all-reduce or skips it (the same blocks
on every process), so both kinds of step are timed side by side in one
run. Each process reports the median loop iteration (step, bookkeeping and
the check) of either kind; the first 20 steps are not timed.

  .venv/bin/python bench/stop_check.py [--steps=260] [--engines=...]
"""

import argparse
import atexit
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tf_resnet.engines import registry  # noqa: E402

BLOCK = 10
WORKER = "STOP_CHECK_WORKER"


def worker():
    """`resnet_main.py` on resnet8, the stop check on and off in blocks."""
    import resnet_main
    from tf_resnet import models

    models.register_resnet8()

    times = {True: [], False: []}
    make_distributor = resnet_main.make_distributor

    def alternating_make_distributor(*args, **kwargs):
        mode = make_distributor(*args, **kwargs)
        mode.stop_check_every_steps = 1
        check = mode.any_process_stopping
        calls = {"n": 0, "last": None}

        def alternating_check(flag):
            calls["n"] += 1
            on = (calls["n"] // BLOCK) % 2 == 0  # The same on every process.
            value = check(flag) if on else bool(flag)
            now = time.perf_counter()
            if calls["last"] is not None and calls["n"] > 2 * BLOCK:
                times[on].append(now - calls["last"])
            calls["last"] = now
            return value

        mode.any_process_stopping = alternating_check
        return mode

    def report():
        medians = {
            on: 1e3 * sorted(values)[len(values) // 2]
            for on, values in times.items()
            if values
        }
        if len(medians) == 2:
            line = f"STOP_CHECK {medians[True]:.3f} {medians[False]:.3f}"
            print(line, file=sys.stderr, flush=True)

    resnet_main.make_distributor = alternating_make_distributor
    atexit.register(report)
    resnet_main.main()


def measure(engine, steps, data):
    """`[(with check ms, without ms)]` of each process of one run."""
    launcher = registry.get(engine).launcher
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            sys.executable, "-m", f"tf_resnet.launch.{launcher}", "--np=2",
            f"--main={os.path.abspath(__file__)}", "--",
            f"--distribution={engine}",
            "--dataset=cifar10", f"--train_data_path={data}/data_batch_*",
            f"--eval_data_path={data}/test_batch.bin",
            f"--log_root={scratch}/log", "--model=resnet8",
            "--batch_size=32", f"--train_steps={steps}",
            "--log_every_steps=1000", "--eval_every_steps=1000",
            "--checkpoint_every_steps=1000", "--dtype=float32",
        ]  # fmt: skip
        env = {**os.environ, WORKER: "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
        output = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True
        ).stderr
    found = re.findall(r"STOP_CHECK ([\d.]+) ([\d.]+)", output)
    if len(found) != 2:
        raise RuntimeError(output[-3000:])
    return [(float(on), float(off)) for on, off in found]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=260)
    parser.add_argument("--engines", default="multi_worker,horovod")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "data", "make_synthetic_cifar.py"),
                f"--output_dir={folder}",
                "--train_per_batch=200",
                "--test_count=200",
                "--seed=1",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        data = os.path.join(folder, "cifar-10-batches-bin")
        print(f"load {os.getloadavg()[0]:.2f} at start")
        print("| engine | process | step with check ms | without | ratio |")
        print("| --- | --- | --- | --- | --- |")
        for engine in args.engines.split(","):
            for index, (on, off) in enumerate(
                measure(engine, args.steps, data)
            ):
                print(
                    f"| {engine} | {index} | {on:.1f} | {off:.1f} | "
                    f"{on / off:.3f} |"
                )
        print(f"load {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    if os.environ.get(WORKER):
        worker()
    else:
        main()

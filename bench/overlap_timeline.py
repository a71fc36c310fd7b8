"""Where a `multi_worker` step's time goes on an emulated link: a profile.

`tests/profile_step.py` runs profiled training steps of two
`multi_worker` processes, each on its own emulated node (one core, a
link shaped to `--rate_mbit`, as `network_scaling.py` shapes it), and
this prints, for each profiled step of each process, the backward pass's
span, every all-reduce's (TensorFlow's `CollectiveReduceV2` ops, one per
pack), how much of the backward pass an all-reduce was in flight, and
what ran after it. What the efficiency rows of `network_scaling.py`
cannot say: whether the link waits for gradients, the all-reduces for
each other, or the step for the last packs.

Horovod's all-reduces run outside TensorFlow's executor (its ops only
enqueue them), so its profile would not show them: `multi_worker` only.

As root (it makes network namespaces); `--rate_mbit` is the link that
`network_scaling.py` printed for the model on this machine:

  .venv/bin/python bench/overlap_timeline.py --rate_mbit=1289
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import common  # noqa: F401  # The checkout on sys.path.
import emulated_cluster

PROFILE_STEP = os.path.join(common.ROOT, "tests", "profile_step.py")
ALL_REDUCE = "CollectiveReduceV2"
# A job whose process TensorFlow's profiler crashed is started again
# (tests/test_overlap.py says when it does).
JOBS = 3


def profile_job(cluster, args, out):
    """Runs the two profiled processes; True if both ended well."""
    workers = [f"{cluster.address(n)}:{24000 + n}" for n in (0, 1)]
    processes = []
    for index in (0, 1):
        task = {"type": "worker", "index": index}
        env = {
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "OMP_NUM_THREADS": "1",
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": workers}, "task": task}
            ),
        }
        argv = [
            sys.executable, PROFILE_STEP, out, "distribution=multi_worker",
            f"model={args.model}", f"batch_size={2 * args.batch}",
            f"image_size={args.image_size}", f"classes={args.classes}",
            f"all_reduce_pack_bytes={args.pack_bytes}",
        ]  # fmt: skip
        processes.append(
            cluster.spawn(
                index,
                argv,
                cpus=index,
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    errors = [p.communicate(timeout=900)[1] for p in processes]
    for process, error in zip(processes, errors, strict=True):
        if process.returncode:
            print(f"a process ended with {process.returncode}: "
                  f"{error[-600:]}", file=sys.stderr)  # fmt: skip
    return not any(p.returncode for p in processes)


def union_ms(spans, start, end):
    """Milliseconds of [start, end] covered by any of `spans` (us)."""
    covered, reach = 0.0, start
    for s, e in sorted(spans):
        s, e = max(s, reach), min(e, end)
        if e > s:
            covered += e - s
            reach = e
    return covered / 1e3


def step_line(events):
    """The figures of one profiled step (events in us from its start)."""
    backward = [
        (s, e) for op, _, s, e in events if op.startswith("gradient_tape/")
    ]
    first, last = min(s for s, _ in backward), max(e for _, e in backward)
    reduces = sorted((s, e) for _, kind, s, e in events if kind == ALL_REDUCE)
    end = max(e for *_, e in events)
    return {
        "step_ms": end / 1e3,
        "backward_ms": (first / 1e3, last / 1e3),
        "in_flight_ms": union_ms(reduces, first, last),
        "after_ms": (end - last) / 1e3,
        "spans": [(s / 1e3, e / 1e3) for s, e in reduces],
    }


def report(results, description):
    print(f"multi_worker: {description}\n")
    print("| process | step ms | backward pass ms | all-reduce in flight "
          "during it | the step after it ms | all-reduces (ms from the "
          "step's start) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    by_process = []
    for process, result in enumerate(results):
        by_process.append([step_line(e) for e in result["profiles"]])
        for line in by_process[-1]:
            first, last = line["backward_ms"]
            share = line["in_flight_ms"] / (last - first)
            spans = " ".join(f"{s:.0f}-{e:.0f}" for s, e in line["spans"])
            print(f"| {process} | {line['step_ms']:.0f} | {first:.0f}-"
                  f"{last:.0f} | {100 * share:.0f}% | "
                  f"{line['after_ms']:.0f} | {spans} |")  # fmt: skip
    lines = [line for steps in by_process for line in steps]
    median = {
        key: statistics.median(line[key] for line in lines)
        for key in ("step_ms", "after_ms")
    }
    # A step waits for the process whose backward pass ends last.
    apart = [
        abs(a["backward_ms"][1] - b["backward_ms"][1])
        for a, b in zip(*by_process, strict=True)
    ]
    print(f"\nmedians: step {median['step_ms']:.0f} ms, of which "
          f"{median['after_ms']:.0f} ms after the backward pass; the two "
          "processes' backward passes of a step end "
          f"{statistics.median(apart):.0f} ms apart")  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate_mbit", type=float, required=True,
                        help="each node's link, Mbit/s")  # fmt: skip
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=32, help="per process")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument(
        "--pack_bytes", type=int, default=0,
        help="--all_reduce_pack_bytes (0: the default)",
    )  # fmt: skip
    args = parser.parse_args()
    missing = emulated_cluster.missing_programs()
    if missing:
        sys.exit(f"overlap_timeline: needs {', '.join(missing)}")
    common.print_environment("A multi_worker step on an emulated link")
    folder = tempfile.mkdtemp(prefix="overlap_timeline_")
    with emulated_cluster.EmulatedCluster(2, args.rate_mbit) as cluster:
        for job in range(JOBS):
            out = os.path.join(folder, f"job{job}")
            if profile_job(cluster, args, out):
                break
        else:
            sys.exit(f"overlap_timeline: a process failed in each of {JOBS} "
                     "jobs")  # fmt: skip
    results = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(f"job{job}."):
            with open(os.path.join(folder, name)) as stream:
                results.append(json.load(stream))
    report(results, f"{args.model}, batch {args.batch} per process, "
           f"{results[0]['all_reduce']}; links of {args.rate_mbit:g} Mbit/s, "
           "one core per node")  # fmt: skip


if __name__ == "__main__":
    main()

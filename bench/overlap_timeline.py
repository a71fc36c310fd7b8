"""Where a synchronous step's time goes on an emulated link: a profile.

`profile_step.py` runs profiled training steps of two processes of
`multi_worker` or `horovod`, each on its own emulated node (one core, a
link shaped to `--rate_mbit`), started as `network_scaling.py` starts its
jobs, and this prints, for each job, the medians over its profiled steps of: the
step, the part of it after the backward pass, how far apart the two
processes' backward passes of a step end (the step waits for the
later), and for `multi_worker` how much of the backward pass an
all-reduce (TensorFlow's `CollectiveReduceV2` ops, one per pack) was in
flight; with `--steps`, every step of each engine's last job with its
all-reduces' spans. The engines' jobs run in turn, `--rounds` each.
What the efficiency rows of `network_scaling.py` cannot say: whether
the link waits for gradients, the all-reduces for each other, or a
process for its peer.

Horovod's all-reduces run outside TensorFlow's executor (its ops only
enqueue them), so its profile shows its backward passes, not its
all-reduces.

As root (it makes network namespaces); `--rate_mbit` is the link that
`network_scaling.py` printed for the model on this machine:

  .venv/bin/python bench/overlap_timeline.py --rate_mbit=1289 --steps
"""

import argparse
import glob
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import common
import emulated_cluster
import network_jobs

PROFILE_STEP = os.path.join(common.ROOT, "bench", "profile_step.py")
ALL_REDUCE = "CollectiveReduceV2"
# A job whose process TensorFlow's profiler crashed is started again
# (tests/test_overlap.py says when it does).
JOBS = 3


class ProfiledJob(network_jobs.Job):
    """`profile_step.py` on two nodes, started as the bench's jobs."""

    def __init__(self, cluster, engine, out, words):
        super().__init__(cluster, {"flags": {"distribution": engine}}, 2)
        self.out, self.words = out, words

    def worker_argv(self, extra=None):
        del extra
        return [sys.executable, PROFILE_STEP, self.out, *self.words]


def profile_job(cluster, engine, out, words):
    """Each process's profiled steps; None if a process failed."""
    job = ProfiledJob(cluster, engine, out, [f"distribution={engine}", *words])
    try:
        chief = job.start()
        _, error = chief.communicate(timeout=900)
        # The other process ends with the chief (`end_of_run`).
        deadline = time.monotonic() + 60
        while len(glob.glob(f"{out}.*")) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        cluster.stop_processes()
    paths = sorted(glob.glob(f"{out}.*"))
    if chief.returncode or len(paths) < 2:
        print(f"a process failed (the chief's code {chief.returncode}): "
              f"{error[-600:]}", file=sys.stderr)  # fmt: skip
        return None
    return [json.loads(pathlib.Path(path).read_text()) for path in paths]


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


def summary(results):
    """A job's medians over its profiled steps (both processes)."""
    lines = [[step_line(e) for e in r["profiles"]] for r in results]
    every = [line for steps in lines for line in steps]
    # A step waits for the process whose backward pass ends last.
    apart = [
        abs(a["backward_ms"][1] - b["backward_ms"][1])
        for a, b in zip(*lines, strict=True)
    ]
    in_flight = [
        line["in_flight_ms"] / (line["backward_ms"][1] - line["backward_ms"][0])
        for line in every
        if line["spans"]
    ]
    return {
        "step_ms": statistics.median(line["step_ms"] for line in every),
        "after_ms": statistics.median(line["after_ms"] for line in every),
        "apart_ms": statistics.median(apart),
        "in_flight": statistics.median(in_flight) if in_flight else None,
        "lines": lines,
    }


def print_steps(engine, lines):
    """Every profiled step of a job, with its all-reduces' spans."""
    print(f"\n{engine}, the last round's job, step by step (ms from each "
          "process's step start):\n")  # fmt: skip
    print("| process | step ms | backward pass ms | after it ms | "
          "all-reduces |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")
    for process, steps in enumerate(lines):
        for line in steps:
            first, last = line["backward_ms"]
            spans = " ".join(f"{s:.0f}-{e:.0f}" for s, e in line["spans"])
            print(f"| {process} | {line['step_ms']:.0f} | {first:.0f}-"
                  f"{last:.0f} | {line['after_ms']:.0f} | "
                  f"{spans or 'not in the profile'} |")  # fmt: skip


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
    parser.add_argument(
        "--inter_op_threads", type=int, default=2,
        help="of each process (its node has one core)",
    )  # fmt: skip
    parser.add_argument("--engines", default="horovod,multi_worker")
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="jobs per engine, the engines in turn",
    )  # fmt: skip
    parser.add_argument(
        "--steps", action="store_true",
        help="also each engine's last job step by step",
    )  # fmt: skip
    args = parser.parse_args()
    missing = emulated_cluster.missing_programs()
    if missing:
        sys.exit(f"overlap_timeline: needs {', '.join(missing)}")
    common.print_environment("Synchronous steps on an emulated link")
    words = [
        f"model={args.model}", f"batch_size={2 * args.batch}",
        f"image_size={args.image_size}", f"classes={args.classes}",
        f"all_reduce_pack_bytes={args.pack_bytes}",
        f"inter_op_threads={args.inter_op_threads}",
    ]  # fmt: skip
    engines = args.engines.split(",")
    folder = tempfile.mkdtemp(prefix="overlap_timeline_")
    jobs = {engine: [] for engine in engines}
    plan = None
    with emulated_cluster.EmulatedCluster(2, args.rate_mbit) as cluster:
        for round_ in range(args.rounds):
            for engine in engines:
                for attempt in range(JOBS):
                    out = os.path.join(folder, f"{engine}{round_}-{attempt}")
                    results = profile_job(cluster, engine, out, words)
                    if results:
                        break
                else:
                    sys.exit(f"overlap_timeline: a process failed in each "
                             f"of {JOBS} jobs")  # fmt: skip
                plan = results[0]["all_reduce"]
                jobs[engine].append(summary(results))
    print(f"{args.model}, batch {args.batch} per process, {plan}; links of "
          f"{args.rate_mbit:g} Mbit/s, one core per node, "
          f"{args.inter_op_threads} inter-op threads; each job's "
          "medians over its profiled steps (both processes):\n")  # fmt: skip
    print("| engine | round | profiled step ms | after the backward pass "
          "ms | the two backward passes of a step end apart, ms | "
          "all-reduce in flight during the backward pass |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for engine in engines:
        for round_, job in enumerate(jobs[engine], 1):
            share = job["in_flight"]
            share = "not in the profile" if share is None else f"{share:.0%}"
            print(f"| {engine} | {round_} | {job['step_ms']:.0f} | "
                  f"{job['after_ms']:.0f} | {job['apart_ms']:.0f} | "
                  f"{share} |")  # fmt: skip
    if args.steps:
        for engine in engines:
            print_steps(engine, jobs[engine][-1]["lines"])


if __name__ == "__main__":
    main()

"""Each Slurm script on the two-node test cluster: final state, wall time.

Starts the cluster of `tests/slurm_cluster.py` (root, Debian's slurm-wlm
and munge), submits the jobs of `tests/test_slurm_cluster.py` one after
another (small data, 2 steps, as the tests run them) and prints a table of
the cluster's start-up and of each job's final state and wall time, read
from Slurm's job completion log. One job at a time, so the times do not
share the 2 cores.

  .venv/bin/python bench/slurm_jobs.py [--jobs=course_cifar100,...]
"""

import argparse
import datetime
import os
import pathlib
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import cpu_model  # noqa: E402
from tests import test_slurm_cluster as cluster_tests  # noqa: E402
from tests.slurm_cluster import SlurmCluster  # noqa: E402


def seconds(record):
    start, end = (
        datetime.datetime.fromisoformat(record[key])
        for key in ("StartTime", "EndTime")
    )
    return (end - start).total_seconds()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", default=",".join(cluster_tests.JOBS))
    args = parser.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="slurm_bench_"))
    started = time.monotonic()
    cluster = SlurmCluster(root / "cluster")
    os.makedirs(cluster.root)
    cluster.start()
    rows = [("cluster start-up (to both nodes idle)", "", "",
             f"{time.monotonic() - started:.1f}")]  # fmt: skip
    try:
        data = cluster_tests.make_data(root)
        for name in args.jobs.split(","):
            home = root / name
            home.mkdir()
            job = cluster_tests.submit(cluster, name, data, home)
            cluster.wait(job, cluster_tests.JOB_TIMEOUT)
            (record,) = cluster.completions(job)
            rows.append((name, record["NodeList"], record["JobState"],
                         f"{seconds(record):.0f}"))  # fmt: skip
    finally:
        cluster.stop()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")
    print("| job | nodes | final state | wall time (s) |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

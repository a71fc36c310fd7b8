"""The gradient all-reduce overlapped with the backward pass, from profiles.

`bench/profile_step.py` runs one step of two processes under TensorFlow's
profiler, started by each engine's launcher (loopback namespaces), and
the chief's op events are read back. An optimizer update of a variable
runs once its all-reduced gradient exists, so an update that starts
before the last gradient op of the backward pass ends shows that its
bucket's all-reduce was issued and finished while the backward pass was
still computing. With `--nooverlap_all_reduce` no update may start before
the backward pass ends: the test would see the difference.

ResNet-20 with buckets (packs) of 64 KiB: ten of them, the first holding
the classifier and the last block, which the backward pass computes
first.
"""

import json
import subprocess
import sys
import types

import pytest

from tests.helpers import ROOT, requires_horovod
from tf_resnet import dry_run, runtime
from tf_resnet.config.settings import DistributionConfig, RuntimeConfig
from tf_resnet.distribute import buckets
from tf_resnet.engines import registry

PROFILE_STEP = f"{ROOT}/bench/profile_step.py"
# How the launcher names a process TensorFlow itself brought down.
# TensorFlow's profiler crashes a profiled multi_worker process now and
# then as it collects the trace (`tf.profiler.experimental.stop`: SIGSEGV
# in libc's malloc; once a SIGBUS), far more often on the newest
# TensorFlow than on the pinned one, while the same steps unprofiled
# train fine. Such a job does not count: up to `JOBS` are started.
CRASHES = ("(SIGBUS)", "(SIGSEGV)", "(SIGABRT)", "(SIGILL)")
JOBS = 8
# Jobs that ran whose updates all waited: a machine busy with other work
# can hold back a process's peer through all of a job's profiled steps.
TRIES = 3
UPDATES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def profile(tmp_path, engine, *settings):
    """Each process's profiled steps and its start line's words.

    None if a process of the job crashed (`CRASHES`).
    """
    name = "-".join(settings).replace("=", "_")
    out = tmp_path / f"{engine}-{name}.json"
    launcher = "horovod" if engine == "horovod" else "tf_config_cluster"
    command = [
        sys.executable, "-m", f"tf_resnet.launch.{launcher}", "--np=2",
        f"--main={PROFILE_STEP}", "--", str(out), f"distribution={engine}",
        "model=resnet20", "batch_size=256", *settings,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    if done.returncode and any(x in done.stderr for x in CRASHES):
        return None
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results = [
        json.loads(p.read_text()) for p in tmp_path.glob(f"{out.name}.*")
    ]
    assert len(results) == 2, results
    return results


def early_updates(results):
    """Per process and profiled step: updates before its backward pass ended.

    A bucket's all-reduce returns once both processes have issued it, so
    on a loaded machine the process that runs ahead waits for its peer;
    the one that lags shows the overlap.
    """
    return [
        overlap(events)[0]
        for result in results
        for events in result["profiles"]
    ]


def overlap(events):
    """`(updates before the backward pass ended, all updates)`."""
    backward_end = max(
        end for op, _, _, end in events if op.startswith("gradient_tape/")
    )
    updates = [
        start
        for op, kind, start, _ in events
        if op.startswith("sgd/") and kind in UPDATES
    ]
    assert updates, "no optimizer update in the profile"
    return sum(start < backward_end for start in updates), len(updates)


ENGINES = [
    pytest.param("horovod", marks=requires_horovod),
    "multi_worker",
]


def profiled_jobs(tmp_path, engine, setting):
    """The results of each job none of whose processes crashed.

    At most `JOBS` jobs are started.
    """
    for job in range(JOBS):
        folder = tmp_path / f"{setting.replace('=', '_')}-{job}"
        folder.mkdir()
        results = profile(folder, engine, setting)
        if results:
            yield results


@pytest.mark.parametrize("engine", ENGINES)
def test_the_all_reduce_overlaps_the_backward_pass(tmp_path, engine):
    overlapped = None
    jobs = profiled_jobs(tmp_path, engine, "all_reduce_pack_bytes=65536")
    for tries, overlapped in enumerate(jobs, 1):
        early = early_updates(overlapped)
        if max(early) > 0 or tries == TRIES:
            break
    assert overlapped, f"a process crashed in each of {JOBS} jobs"
    assert overlapped[0]["all_reduce"].startswith(
        "10 bucket(s) of about 0.0625"
    )
    assert max(early) > 0, f"no update before a backward pass ended: {early}"

    jobs = profiled_jobs(tmp_path, engine, "overlap_all_reduce=False")
    one_group = next(jobs, None)
    assert one_group, f"a process crashed in each of {JOBS} jobs"
    assert "after the backward pass" in one_group[0]["all_reduce"]
    early = early_updates(one_group)
    assert max(early) == 0, f"updates before the all-reduce: {early}"


def test_buckets_take_the_last_tensors_first():
    class Tensor:  # What `plan` reads of a tensor.
        def __init__(self, elements):
            self.shape, self.dtype = (elements,), "float32"

    tensors = [Tensor(4), None, Tensor(2), Tensor(1), Tensor(8)]
    # 8 bytes: the last tensor (32 bytes) alone, then more than 8 bytes
    # from the end on (4 + 8), then what is left; the None in none.
    assert buckets.plan(tensors, 8) == [[4], [3, 2], [0]]
    assert buckets.plan(tensors, 1000) == [[4, 3, 2, 0]]
    reduced = buckets.all_reduce(
        tensors, 8, lambda bucket: [len(bucket)] * len(bucket)
    )
    assert reduced == [1, None, 2, 2, 1]


def test_an_overlapped_all_reduce_gets_a_second_inter_op_thread():
    """On one core TensorFlow's default is one inter-op thread, which the
    backward pass holds: the overlapping engines get two there, unless
    `--inter_op_threads` says otherwise."""
    dist = DistributionConfig()
    for name in ("horovod", "multi_worker"):
        engine = registry.get(name)
        assert runtime.inter_op_threads(0, engine, dist, cores=1) == 2
        assert runtime.inter_op_threads(0, engine, dist, cores=2) == 0
        assert runtime.inter_op_threads(1, engine, dist, cores=1) == 1
        one_group = DistributionConfig(overlap_all_reduce=False)
        assert runtime.inter_op_threads(0, engine, one_group, cores=1) == 0
    for name in ("default", "mirrored", "parameter_server"):
        engine = registry.get(name)
        assert runtime.inter_op_threads(0, engine, dist, cores=1) == 0


def test_dry_run_names_the_all_reduce():
    horovod = registry.get("horovod")

    def line(xla=False, threads=0, **settings):
        dist = DistributionConfig(distribution="horovod", **settings)
        started = types.SimpleNamespace(inter_op_threads=threads)
        return dry_run._all_reduce_knobs(
            horovod, dist, RuntimeConfig(xla=xla), started
        )

    assert line() == [
        "  gradient all-reduce: buckets of about 1 MiB in reverse layer "
        "order, each issued as the backward pass produces it"
    ]
    assert "issued together (--xla" in line(xla=True)[0]
    assert line(threads=2)[0].endswith(
        "as the backward pass produces it, 2 inter-op threads (this "
        "process has one core)"
    )
    assert line(overlap_all_reduce=False, all_reduce_pack_bytes=64) == [
        "  gradient all-reduce: one all-reduce after the backward pass, "
        "packs of 64 bytes"
    ]
    # An engine without a gradient all-reduce: no line.
    assert not dry_run._all_reduce_knobs(
        registry.get("mirrored"),
        DistributionConfig(),
        RuntimeConfig(),
        types.SimpleNamespace(inter_op_threads=0),
    )

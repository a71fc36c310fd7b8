"""`--dry_run` under each launcher: every process prints its plan, nothing runs.

The numbers it prints are held against the modes they describe: the same
config, started and made into a real mode in a fresh process.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import (
    ROOT,
    on_newest_set,
    requires_horovod,
    run_main,
    run_python,
)

DATA = ["--train_data_path=x", "--eval_data_path=y"]


def launch(launcher, launcher_flags, log_root, *flags, pin=()):
    """Runs `python -m tf_resnet.launch.<launcher>` with `--dry_run`.

    `pin`: a command its processes run under (`taskset -c 0`).
    """
    proc = subprocess.run(
        [
            *pin, sys.executable, "-m", f"tf_resnet.launch.{launcher}",
            *launcher_flags, "--", "--dry_run", *DATA,
            f"--log_root={log_root}", *flags,
        ],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert not os.path.exists(log_root)  # Nothing written.
    # horovodrun prefixes each line with its rank: `[1]<stdout>:`.
    by_process = {}
    for line in proc.stdout.splitlines():
        prefix, _, text = line.rpartition("<stdout>:")
        if text.startswith("dry run: "):
            by_process.setdefault(prefix, []).append(text[len("dry run: ") :])
        elif text.startswith("  ") and by_process.get(prefix):
            by_process[prefix][-1] += "\n" + text
    return [report for reports in by_process.values() for report in reports]


@on_newest_set  # A launcher's plan (tests/helpers.py).
def test_under_the_multi_worker_launcher(tmp_path):
    reports = launch("tf_config_cluster", ["--np=2"], tmp_path / "run")
    assert len(reports) == 2, reports
    assert sorted(r.splitlines()[0] for r in reports) == [
        "process 0 of 2 on this node (the launcher)",
        "process 1 of 2 on this node (the launcher)",
    ]
    for report in reports:
        assert "engine: multi_worker (--distribution)" in report
        assert "replicas: 1 in this process, 2 in sync over 2" in report
        assert "batch: 64 per replica, 128 global, 128 per update" in report
        assert "devices: CPU (no GPU visible)" in report


@on_newest_set  # A launcher's plan (tests/helpers.py).
def test_workers_of_one_core_get_a_second_inter_op_thread(tmp_path):
    """Pinned to one core, each worker's overlapped all-reduce would have
    no inter-op thread beside the backward pass's: it gets two."""
    reports = launch(
        "tf_config_cluster", ["--np=2"], tmp_path / "run",
        pin=("taskset", "-c", "0"),
    )  # fmt: skip
    assert len(reports) == 2, reports
    for report in reports:
        assert report.endswith(
            "each issued as the backward pass produces it, 2 inter-op "
            "threads (this process has one core)"
        ), report


@on_newest_set  # A launcher's plan (tests/helpers.py).
def test_under_the_parameter_server_launcher(tmp_path):
    reports = launch("ps", ["--num_ps=1", "--num_workers=2"], tmp_path / "run")
    heads = sorted(r.splitlines()[1] for r in reports)
    assert heads == [
        "  engine: parameter_server (--distribution)",
        "  engine: parameter_server (--job_name=ps)",
        "  engine: parameter_server (--job_name=worker)",
        "  engine: parameter_server (--job_name=worker)",
    ]
    (coordinator,) = [r for r in reports if "(--distribution)" in r]
    assert "coordinator computes nothing" in coordinator
    assert "2 worker(s) updating asynchronously" in coordinator


@requires_horovod
def test_under_the_horovod_launcher(tmp_path):
    reports = launch(
        "horovod", ["--np=2"], tmp_path / "run", "--learning_rate=0.2"
    )
    assert len(reports) == 2
    for report in reports:
        assert "engine: horovod (started as one of 2 ranks" in report
        assert "2 in sync over 2 process(es)" in report
        assert "learning rate: 0.2 at batch 128 -> 0.2 at 128" in report


@on_newest_set  # A launcher's plan (tests/helpers.py).
def test_a_single_process_needs_no_launcher(tmp_path):
    proc = run_main(
        ["--dry_run", *DATA, f"--log_root={tmp_path / 'run'}",
         "--cpu_replicas=2", "--batch_size=256", "--dtype=float64",
         "--accumulate_steps=4", "--gradient_compression=fp16"]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "engine: mirrored (auto: one process with 2 device(s))" in (
        proc.stdout
    )
    assert "devices: CPU as 2 logical devices" in proc.stdout
    assert (
        "batch: 128 per replica, 256 global, 256 per update, each replica's "
        "batch in 4 micro-batches of 32\n"
    ) in proc.stdout
    assert "gradient all-reduce: fp16 on the wire" in proc.stdout
    assert "learning rate: 0.1 at batch 128 -> 0.2 at 256" in proc.stdout
    assert "dtype policy: float64 (--dtype=float64)" in proc.stdout
    assert not (tmp_path / "run").exists()


SAME_AS_THE_MODE = """
import dataclasses, json, sys
import tf_resnet
from tf_resnet import batch_plan, dry_run, runtime
from tf_resnet.config import settings
from tf_resnet.engines.distributors import make_distributor
config = settings.make_config(**json.loads(sys.argv[1]))
started = runtime.start(config)
mode = make_distributor(started.engine, config.optim,
                 config.distribution, started.devices)
in_sync, per_update, _ = dry_run.replicas(config, started)
printed = batch_plan.plan(config.optim, in_sync, per_update,
                          started.engine.name)
print(json.dumps([dataclasses.asdict(printed),
                  dataclasses.asdict(mode.batch), mode.num_replicas]))
"""


@pytest.mark.parametrize(
    "values",
    [
        {"cpu_replicas": 2, "batch_size": 64, "accumulate_steps": 2},
        {"distribution": "default"},
        {"distribution": "mirrored", "cpu_replicas": 2},
    ],
)
def test_the_printed_batch_plan_is_the_modes(values):
    output = run_python(SAME_AS_THE_MODE, json.dumps(values))
    printed, modes, replicas = json.loads(output.strip().splitlines()[-1])
    assert printed == modes
    assert printed["replicas"] == replicas

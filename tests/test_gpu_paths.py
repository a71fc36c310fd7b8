"""The GPU paths, as far as a machine without GPUs can check them.

* The GPU requirement set resolves against the package index (pip's own
  resolver, `--dry-run`), pins what the pinned set pins, and the NCCL
  wheel Horovod's NCCL build uses at the version TensorFlow's extra pins.
  The install itself (several GB) is `scripts/check_gpu_install.sh`, run
  by hand, never in CI.
* `scripts/gpu_check.sh`, which users run on their GPUs, runs here on two
  logical CPU devices and passes its own comparison.

The device plan of each engine is `tests/test_devices.py`; mixed_float16
through the project's optimizer builder is `tests/test_performance_flags.py`.
"""

import json
import os
import re
import subprocess
import sys

from tests.helpers import ROOT, on_newest_set, on_one_set


def pins(name):
    with open(os.path.join(ROOT, name)) as stream:
        lines = [line.split("#")[0].strip() for line in stream]
    return dict(line.split("==") for line in lines if "==" in line)


PINNED = pins("requirements.txt")


# pip resolves the GPU set whatever is installed: on one set, the newest,
# whose leg is the shorter (tests/helpers.py).
@on_newest_set
def test_the_gpu_requirement_set_resolves(tmp_path):
    gpu = pins("requirements-gpu.txt")
    # setup.sh builds Horovod itself (with NCCL for this set): no wheel.
    del gpu["horovod"]
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("".join(f"{k}=={v}\n" for k, v in gpu.items()))
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
         "--ignore-installed", "--report", str(report),
         "-r", str(requirements)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(report) as stream:
        metadata = [item["metadata"] for item in json.load(stream)["install"]]
    resolved = {item["name"].lower(): item["version"] for item in metadata}
    assert resolved["tensorflow"] == PINNED["tensorflow-cpu"]
    assert "nvidia-cudnn-cu12" in resolved  # The [and-cuda] extra.
    for name, version in PINNED.items():
        if name not in ("tensorflow-cpu", "horovod"):
            assert resolved[name.lower()] == version, name
    # setup.sh builds Horovod's NCCL operations against the NCCL wheel the
    # set pins: the one TensorFlow's [and-cuda] extra pins.
    (tensorflow,) = [m for m in metadata if m["name"].lower() == "tensorflow"]
    and_cuda = dict(
        re.findall(
            r"^(nvidia-[\w-]+) ?==([\w.]+) ; extra == .and-cuda.",
            "\n".join(tensorflow["requires_dist"]),
            re.M,
        )
    )
    nvidia = {name: v for name, v in gpu.items() if name.startswith("nvidia-")}
    assert "nvidia-nccl-cu12" in nvidia
    for name, version in nvidia.items():
        assert version == and_cuda[name] == resolved[name], name


@on_one_set  # The GPU set is the pinned set's variant.
def test_gpu_check_runs_and_passes_without_gpus(tmp_path):
    proc = subprocess.run(
        [os.path.join(ROOT, "scripts", "gpu_check.sh")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={**os.environ, "ENGINES": "mirrored", "STEPS": "2",
             "OUT": str(tmp_path / "out"), "PYTHON": sys.executable},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "| mirrored = default | pass |" in proc.stdout
    assert "no GPUs: 2 logical CPU devices" in proc.stdout
    assert (
        "engine: mirrored" in (tmp_path / "out" / "mirrored.plan").read_text()
    )

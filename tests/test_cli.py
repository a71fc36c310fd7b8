"""resnet_main.py: flags, clear errors, nothing half-written."""

import os
import re
import subprocess

import pytest

from tests.data_files import cifar100_files
from tests.helpers import (
    ROOT,
    on_newest_set,
    on_one_set,
    requires_horovod,
    run_main,
)


def base_args(synthetic, log_root):
    return [
        f"--train_data_path={synthetic['train']}",
        f"--eval_data_path={synthetic['eval']}",
        f"--log_root={log_root}",
        "--batch_size=16",
        "--eval_batch_count=1",
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--eval_once"], "--eval_once only makes sense with --mode=eval"),
        (["--num_gpus=1"], "--num_gpus=1 but 0 GPU(s) are visible"),
        (["--batch_size=15", "--cpu_replicas=2"], "not divisible by the 2"),
        (
            ["--accumulate_steps=3"],
            "--accumulate_steps=3 does not split the 16 examples of each",
        ),
        (["--learning_rate=nan"], "--learning_rate=nan: must be a finite"),
        (["--weight_decay=inf"], "--weight_decay=inf: must be a finite"),
        (
            ["--train_data_path=/nonexistent/data_batch*"],
            "/nonexistent/data_batch*: no file matches",
        ),
    ],
)
@on_newest_set  # Flag checks, not TensorFlow's (tests/helpers.py).
def test_contradictory_or_wrong_flags_fail_clearly(
    synthetic_cifar, tmp_path, extra, message
):
    proc = run_main([*base_args(synthetic_cifar, tmp_path), *extra])
    assert proc.returncode == 2
    error_lines = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(error_lines) == 1 and message in error_lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not os.listdir(tmp_path)  # Nothing written before the error.


def test_checkpoint_of_another_model_is_refused(synthetic_cifar, tmp_path):
    args = [*base_args(synthetic_cifar, tmp_path), "--train_steps=1"]
    assert run_main([*args, "--model=resnet20"]).returncode == 0
    before = sorted(os.listdir(tmp_path))
    proc = run_main([*args, "--model=resnet32", "--train_steps=2"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "ckpt-1: checkpoint in --log_root" in proc.stderr
    assert "does not match this model" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == before


def test_a_run_leaves_no_partly_read_cache(synthetic_cifar, tmp_path):
    """The split's table is cached whole even when a pipeline stops early.

    Training stops mid-epoch and `--eval_batch_count` stops an evaluation
    early; TensorFlow discards (and says so) a cache whose input was not
    read to its end, and the next evaluation would read its records again.
    """
    proc = run_main(
        [*base_args(synthetic_cifar, tmp_path), "--train_steps=2"],
        env={"TF_CPP_MIN_LOG_LEVEL": "0"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "did not fully read the dataset being cached" not in proc.stderr


def test_a_checkpoint_logs_no_tensorflow_internals(synthetic_cifar, tmp_path):
    """TensorFlow's saver logs a callback's time at every save (INFO); the
    run's own lines stay."""
    proc = run_main(
        [*base_args(synthetic_cifar, tmp_path), "--train_steps=2",
         "--checkpoint_every_steps=1", "--log_every_steps=1"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.exists(tmp_path / "ckpt-2.index"), os.listdir(tmp_path)
    assert "Sharding callback duration" not in proc.stderr, proc.stderr
    assert "step 2/2" in proc.stderr and "done:" in proc.stderr, proc.stderr


def test_a_run_on_cifar_binaries_logs_no_error_line(synthetic_cifar, tmp_path):
    """TensorFlow's oneDNN pass logged a false `E` line (uint8 "only on
    platforms with AVX-512") at every start; a run without a problem has
    no error line at all, at TensorFlow's most verbose level."""
    proc = run_main(
        [*base_args(synthetic_cifar, tmp_path), "--train_steps=2"],
        env={"TF_CPP_MIN_LOG_LEVEL": "0"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    errors = [
        x for x in proc.stderr.splitlines() if re.match(r"\S+ \S+: E ", x)
    ]
    assert not errors, errors


@on_newest_set  # The loop's logging, not TensorFlow's (tests/helpers.py).
def test_progress_comes_by_the_clock_as_well_as_by_steps(
    synthetic_cifar, tmp_path
):
    """A slow run is never silent for long: a line after --log_every_secs
    without one, whatever --log_every_steps says."""
    args = [*base_args(synthetic_cifar, tmp_path), "--train_steps=5",
            "--log_every_steps=1000"]  # fmt: skip
    steps = re.compile(r"step (\d)/5 \(")
    quiet = run_main(
        [*args, f"--log_root={tmp_path / 'quiet'}", "--log_every_secs=600"]
    )
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert steps.findall(quiet.stderr) == ["5"]  # Only the last.
    clock = run_main(
        [*args, f"--log_root={tmp_path / 'clock'}", "--log_every_secs=1e-3"]
    )
    assert clock.returncode == 0, clock.stderr[-2000:]
    assert steps.findall(clock.stderr) == ["1", "2", "3", "4", "5"]


def test_help_lists_the_settings_by_group_and_exits_0():
    proc = run_main(["--help"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    sections = re.findall(r"^(\w+) settings - .*:$", out, re.M)
    assert sections == [
        "data", "model", "optim", "run", "distribution", "runtime"
    ], out  # fmt: skip
    for flag in ("--dataset", "--train_epochs", "--learning_rate", "--preset"):
        assert f"\n  {flag}: " in out, flag
    # The flag a student starts with first, its choices unbroken, and the
    # example's paths where data/download.py puts the data.
    assert out.index("--preset:") < out.index("data settings")
    for preset in ("course_sync_cifar100", "course_tinyimagenet"):
        assert preset in " ".join(out.split()), preset
    assert "'datasets/cifar-10-batches-bin/data_batch*'" in out
    assert "--log_root=/tmp/" not in out and "\n  python " not in out
    # A path in a flag's help is not cut at its hyphens either.
    assert "datasets/cifar-10-batches-bin/test_batch.bin;" in out
    assert out.index("--dataset:") < out.index("model settings")
    assert out.index("model settings") < out.index("--model:")
    assert "--tpu" not in out and "--test_srcdir" not in out
    assert "Exit codes: 0 done; 2 bad input or flags" in out
    assert "--helpfull" in out
    full = run_main(["--helpfull"])
    assert full.returncode == 0, full.stderr[-2000:]
    assert "--dataset:" in full.stdout and "absl.flags:" in full.stdout


@pytest.mark.parametrize(
    "arg, message",
    [
        ("--epochs=3", "unknown flag --epochs; here: --train_epochs"),
        ("--lr=0.1", "unknown flag --lr; here: --learning_rate"),
        ("--resume", "unknown flag --resume; here: no flag: a run resumes"),
        ("--data_dir=x", "unknown flag --data_dir; here: --train_data_path"),
        ("--bogus_flag=1", "Unknown command line flag 'bogus_flag'"),
        ("--dataset=cifar1000", "flag --dataset=cifar1000: value should be"),
        ("--train_steps=ten", "flag --train_steps=ten: invalid literal"),
        ("positional", "unexpected argument 'positional'"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(tmp_path, arg, message):
    proc = run_main([f"--log_root={tmp_path / 'run'}", arg])
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("resnet_main: error: ")
    assert message in lines[0], lines[0]
    assert "Did you mean: data_source" not in lines[0]  # Nearest spelling.
    assert not os.path.exists(tmp_path / "run")


def test_setup_help_prints_its_usage_and_sets_nothing_up(tmp_path):
    env = {**os.environ, "TF_RESNET_CACHE": str(tmp_path / "cache")}
    for arg, code, stream in (("--help", 0, "stdout"), ("bogus", 2, "stderr")):
        proc = subprocess.run(
            [os.path.join(ROOT, "setup.sh"), arg],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert proc.returncode == code, proc.stderr
        assert "usage: " in getattr(proc, stream)
        assert "./setup.sh demo" in getattr(proc, stream)
        assert not os.path.exists(tmp_path / "cache")


@pytest.fixture(scope="module")
def cifar100(tmp_path_factory):
    """The CIFAR-100 binary files the course presets read."""
    return cifar100_files(tmp_path_factory.mktemp("cifar100"))


def course_args(files, log_root, preset):
    return [
        f"--preset={preset}",
        f"--train_data_path={files['TRAIN_DATA']}",
        f"--eval_data_path={files['EVAL_DATA']}",
        f"--log_root={log_root}",
        "--train_steps=1",
        "--batch_size=8",
        "--eval_batch_count=1",
    ]


@requires_horovod
def test_the_sync_preset_alone_says_so_at_its_start_and_end(cifar100, tmp_path):
    proc = run_main(course_args(cifar100, tmp_path, "course_sync_cifar100"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    warnings = [i for i, x in enumerate(lines) if "] one process: " in x]
    done = next(i for i, x in enumerate(lines) if "] done: " in x)
    start = next(i for i, x in enumerate(lines) if "] training " in x)
    assert len(warnings) == 2 and warnings[0] < start < done < warnings[1]
    assert (
        "-m tf_resnet.launch.horovod --np=2 -- --preset=course_sync"
        in (lines[warnings[1]])
    )


@on_one_set  # A message, not TensorFlow (tests/helpers.py).
def test_the_async_preset_alone_is_refused_with_its_launcher(
    cifar100, tmp_path
):
    log_root = tmp_path / "run"
    proc = run_main(course_args(cifar100, log_root, "course_async_cifar100"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert "none started this one; on this machine: " in line
    assert "-m tf_resnet.launch.ps --num_ps=1 --num_workers=2 -- " in line
    assert not log_root.exists()


@pytest.mark.parametrize(
    "cray_mpich, mpi, options",
    [
        # Cray's wrapper with cray-mpich loaded: the wrappers compile,
        # linking dynamically.
        (
            "/opt/cray/pe/mpich/8.1.4/ofi/gnu/9.1", "cray",
            "CC=cc CXX=CC CRAYPE_LINK_TYPE=dynamic HOROVOD_WITH_MPI=1",
        ),
        # The wrapper without the module: no MPI to build with.
        ("", "", "HOROVOD_WITH_MPI=1"),
    ],
)  # fmt: skip
def test_setup_finds_crays_mpi_through_its_compiler_wrapper(
    tmp_path, cray_mpich, mpi, options
):
    """What setup.sh decides for Horovod's build under a stand-in `CC`
    (and an `mpicxx` that fails, hiding a real one), without building."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, code in (("CC", 0), ("mpicxx", 127)):
        (bin_dir / name).write_text(f"#!/bin/sh\nexit {code}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CRAY_MPICH_DIR": cray_mpich,
        "TF_RESNET_CACHE": str(tmp_path / "cache"),
    }
    script = (
        'source ./setup.sh && echo "$(horovod_flavour) $(mpi_for_horovod)" '
        "&& mpi_build_options | xargs"
    )
    proc = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    flavour = "mpi-gloo" if mpi else "gloo"
    assert proc.stdout.splitlines() == [f"{flavour} {mpi}", options]
    if mpi:
        assert f"MPI: Cray MPICH ({cray_mpich}) through the compiler " in (
            proc.stderr
        )
    assert not os.path.exists(tmp_path / "cache")

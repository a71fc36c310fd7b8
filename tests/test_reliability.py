"""Kill, stop, diverge, run out of disk: nothing written is lost."""

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess

import numpy as np
import pytest

from tests import engine_runs
from tests.helpers import (
    checkpoint_weights,
    eval_rows,
    on_one_set,
    one_per_set,
    requires_horovod,
    run_main,
    scalars,
    start_main,
    train_args,
    wait_for_step,
)


@pytest.fixture(scope="module")
def reference(synthetic_cifar, tmp_path_factory):
    log_root = tmp_path_factory.mktemp("reference")
    proc = run_main(train_args(synthetic_cifar, log_root))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return log_root


# Two kill steps: one on each set (tests/helpers.py).
@pytest.mark.parametrize("seed", one_per_set(1, 2))
def test_sigkill_then_restart_matches_uninterrupted_run(
    synthetic_cifar, reference, tmp_path, seed
):
    kill_at = random.Random(seed).randint(3, 10)
    args = train_args(synthetic_cifar, tmp_path)
    proc = start_main(args)
    wait_for_step(proc, kill_at)
    proc.kill()
    proc.wait(timeout=30)
    restarted = run_main(args)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    resumed = re.search(r"resumed from \S+ at step (\d+)", restarted.stderr)
    assert resumed, restarted.stderr[-2000:]
    # At most one checkpoint interval (2 steps) lost.
    assert kill_at - 2 <= int(resumed.group(1)) <= kill_at
    expected = checkpoint_weights(reference)
    got = checkpoint_weights(tmp_path)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(expected[name], got[name], err_msg=name)
    assert eval_rows(tmp_path) == eval_rows(reference)


def test_sigterm_writes_a_final_checkpoint_and_flushes_events(
    synthetic_cifar, tmp_path
):
    args = train_args(synthetic_cifar, tmp_path, "--checkpoint_every_steps=100")
    proc = start_main(args)
    wait_for_step(proc, 3)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    stopped = re.search(
        r"stopped: SIGTERM at step (\d+): checkpoint written "
        r"to (\S+); the same command again resumes from it",
        rest,
    )
    assert stopped, rest[-2000:]
    step = int(stopped.group(1))
    assert stopped.group(2).endswith(f"ckpt-{step}")
    assert os.path.exists(stopped.group(2) + ".index")
    logged = [s for s, _ in scalars(str(tmp_path / "train"), "loss")]
    assert logged[-1] == step


def test_nan_loss_stops_naming_step_and_checkpoint(synthetic_cifar, tmp_path):
    proc = run_main(
        train_args(
            synthetic_cifar,
            tmp_path,
            "--learning_rate=1e12",
            "--checkpoint_every_steps=1",
            "--nodeterministic",
        )
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    message = re.search(
        r"diverged: loss is (nan|inf) at step (\d+); last good checkpoint: "
        r"(\S+)",
        proc.stderr,
    )
    assert message, proc.stderr[-2000:]
    step = int(message.group(2))
    last_good = message.group(3)
    assert last_good == "none" or last_good.endswith(f"ckpt-{step - 1}")


@contextlib.contextmanager
def tmpfs(path, options):
    os.makedirs(path, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@on_one_set  # The run directory's check (tests/helpers.py).
def test_read_only_log_root_fails_before_training(synthetic_cifar, tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=1m") as log_root:
        proc = run_main(train_args(synthetic_cifar, log_root))
    assert proc.returncode == 2
    assert f"{log_root}: cannot write here (Read-only file system)" in (
        proc.stderr
    )


def test_full_disk_while_checkpointing_keeps_last_checkpoint(
    synthetic_cifar, tmp_path
):
    # resnet20 checkpoints take 2.2 MB: the second one does not fit in 3 MB.
    with tmpfs(tmp_path / "small", "size=3m") as log_root:
        proc = run_main(
            train_args(synthetic_cifar, log_root, "--eval_every_steps=100")
        )
        kept = tmp_path / "kept"
        shutil.copytree(log_root, kept)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "writing the checkpoint of step 4 failed" in proc.stderr
    assert "No space left on device" in proc.stderr
    assert f"latest complete checkpoint is {log_root}/ckpt-2" in proc.stderr
    # What was written before the disk filled is intact and usable.
    evaluated = run_main(
        [
            "--mode=eval",
            "--eval_once",
            f"--log_root={kept}",
            f"--eval_data_path={synthetic_cifar['eval']}",
            "--batch_size=16",
            "--eval_batch_count=1",
        ]
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert re.search(r"eval \S+ckpt-2: precision", evaluated.stderr)


@requires_horovod
def test_horovod_ranks_resume_together_like_an_uninterrupted_run(
    synthetic_cifar, tmp_path
):
    """A 2-rank run stopped at step 12 resumes on both ranks from there."""

    flags = [
        f"--train_data_path={synthetic_cifar['train']}",
        f"--eval_data_path={synthetic_cifar['eval']}",
        "--distribution=horovod",
        "--model=resnet8",
        "--batch_size=32",
        "--train_steps=20",
        "--checkpoint_every_steps=4",
        "--eval_every_steps=10",
        "--eval_batch_count=2",
        "--log_every_steps=4",
        "--deterministic",
    ]
    pieces = [*flags, f"--log_root={tmp_path / 'pieces'}", "--steps_per_run=12"]
    straight, _ = engine_runs.run_workers(
        ([*flags, f"--log_root={tmp_path / 'straight'}"], 2), (pieces, 2)
    )
    (second,) = engine_runs.run_workers((pieces, 2))
    for rank in (0, 1):
        assert re.search(
            rf"\[{rank}\]<stderr>:.*resumed from \S+ckpt-12 at step 12",
            second.output,
        ), second.output[-3000:]
    for ours, theirs, other_rank in zip(
        straight.weights(0), second.weights(0), second.weights(1), strict=True
    ):
        np.testing.assert_array_equal(theirs, other_rank)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert eval_rows(tmp_path / "straight") == eval_rows(tmp_path / "pieces")

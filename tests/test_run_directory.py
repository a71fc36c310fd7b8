"""The run directory (`--log_root`): its owner, its config, its checkpoints."""

import json
import os
import re
import socket

import pytest

from tests.data_files import write_tiny_imagenet
from tests.helpers import (
    flag_values,
    lock_holder,
    on_one_set,
    run_main,
    start_main,
    train_args,
    wait_for_step,
)
from tf_resnet import builders, summaries
from tf_resnet.config import layers as config_lib
from tf_resnet.config import presets
from tf_resnet.errors import UserInputError


@on_one_set  # The run directory's lock (tests/helpers.py).
def test_a_second_run_on_the_same_log_root_is_refused(
    synthetic_cifar, tmp_path
):
    first = start_main(
        train_args(synthetic_cifar, tmp_path, "--train_steps=400")
    )
    try:
        wait_for_step(first, 2)
        second = run_main(train_args(synthetic_cifar, tmp_path))
        assert second.returncode == 2, second.stderr[-2000:]
        errors = [x for x in second.stderr.splitlines() if "error:" in x]
        assert len(errors) == 1, second.stderr[-2000:]
        assert f"in use by the run of process {first.pid}" in errors[0]
        assert socket.gethostname() in errors[0]
    finally:
        first.terminate()
        first.wait(timeout=120)
    # The first run stopped normally (SIGTERM: final checkpoint) and let go.
    assert first.returncode == 128 + 15
    assert not os.path.exists(tmp_path / "run.lock")


@on_one_set  # The run directory's lock (tests/helpers.py).
def test_a_lock_left_by_a_killed_run_is_taken_over(synthetic_cifar, tmp_path):
    killed = lock_holder(tmp_path)
    killed.kill()
    killed.wait()
    assert (tmp_path / "run.lock").exists()
    proc = run_main(train_args(synthetic_cifar, tmp_path, "--train_steps=2"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        f"taking over the lock of process {killed.pid}, which is gone"
        in proc.stderr
    )
    assert not os.path.exists(tmp_path / "run.lock")


def test_an_unreadable_latest_checkpoint_falls_back_to_the_one_before(
    synthetic_cifar, tmp_path
):
    args = train_args(synthetic_cifar, tmp_path, "--train_steps=4")
    assert run_main(args).returncode == 0
    index = tmp_path / "ckpt-4.index"
    index.write_bytes(index.read_bytes()[:40])  # A partial copy.
    proc = run_main(train_args(synthetic_cifar, tmp_path, "--train_steps=6"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"ckpt-4: checkpoint unreadable", proc.stderr)
    assert re.search(r"resumed from \S+ckpt-2 at step 2\b", proc.stderr)
    assert "does not match" not in proc.stderr


@on_one_set  # The loop's error; the fallback runs on both.
def test_no_readable_checkpoint_fails_naming_them(synthetic_cifar, tmp_path):
    args = train_args(synthetic_cifar, tmp_path, "--train_steps=2")
    assert run_main(args).returncode == 0
    (tmp_path / "ckpt-2.index").write_bytes(b"\0" * 16)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    proc = run_main(train_args(synthetic_cifar, tmp_path, "--train_steps=4"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1 and "none of the checkpoints ckpt-2" in errors[0]
    assert "does not match" not in errors[0]
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


@on_one_set  # The run directory's config.json (tests/helpers.py).
def test_a_corrupt_config_json_is_one_error_with_advice_that_works(
    synthetic_cifar, tmp_path
):
    args = train_args(synthetic_cifar, tmp_path, "--train_steps=2")
    assert run_main(args).returncode == 0
    saved = tmp_path / "config.json"
    saved.write_text('{"config": {')  # Cut short, as by a full disk.
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    args = train_args(synthetic_cifar, tmp_path, "--train_steps=4")
    proc = run_main(args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert f"{saved}: unreadable" in errors[0]
    assert f"mv {saved} {saved}.bad" in errors[0]
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    # As the advice says: moved aside, the same flags resume the run.
    saved.rename(tmp_path / "config.json.bad")
    proc = run_main(args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"resumed from \S+ckpt-2 at step 2\b", proc.stderr)


@on_one_set  # The run directory's config.json (tests/helpers.py).
def test_a_resumed_run_and_the_eval_job_read_the_saved_config(
    synthetic_cifar, tmp_path
):
    first = run_main(
        train_args(
            synthetic_cifar, tmp_path, "--train_steps=6", "--model=resnet32"
        )
    )
    assert first.returncode == 0, first.stderr[-2000:]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["config"]["model"]["model"] == "resnet32"
    assert saved["config"]["optim"]["batch_size"] == 16
    steps_per_epoch = saved["plan"]["steps_per_epoch"]
    assert steps_per_epoch == 1000 // 16
    # Resume with the run directory and a new length only: model, data and
    # batch come from config.json.
    resumed = run_main(
        [f"--log_root={tmp_path}", "--train_steps=8", "--deterministic"]
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert re.search(r"resumed from \S+ckpt-6 at step 6\b", resumed.stderr)
    assert "training resnet32 on cifar10" in resumed.stderr
    assert "global batch 16" in resumed.stderr
    # The eval job, without training data or model flags: the epoch of a
    # checkpoint comes from the saved plan, not from the evaluation split.
    job = run_main(
        [
            "--mode=eval",
            "--eval_once",
            f"--log_root={tmp_path}",
            f"--eval_data_path={synthetic_cifar['eval']}",
            f"--eval_dir={tmp_path / 'eval_job'}",
        ]
    )
    assert job.returncode == 0, job.stderr[-2000:]
    with open(tmp_path / "eval_job" / "eval.csv") as stream:
        rows = {r.split(",")[0]: r.split(",")[1] for r in stream}
    assert list(rows) == ["step", "8"]  # The job's own history.
    assert float(rows["8"]) == pytest.approx(8 / steps_per_epoch, abs=1e-4)


@on_one_set  # A check of flags (tests/helpers.py).
def test_a_mode_that_contradicts_the_launcher_is_refused(
    synthetic_cifar, tmp_path
):
    """One of two horovodrun ranks told to train alone into log_root."""
    proc = run_main(
        train_args(synthetic_cifar, tmp_path, "--distribution=default"),
        env={"HOROVOD_SIZE": "2", "HOROVOD_RANK": "1"},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert "--distribution=default in one of 2 processes" in errors[0]
    assert not os.listdir(tmp_path)


def _tiny_imagenet_without_val_annotations(folder):
    root = str(folder / "tiny-imagenet-200")
    write_tiny_imagenet(root)
    os.remove(os.path.join(root, "val", "val_annotations.txt"))
    return root


@on_one_set  # The run directory's config.json (tests/helpers.py).
@pytest.mark.parametrize("failure", ["tinyimagenet_without_val", "no_eval"])
def test_a_failed_start_leaves_nothing_the_next_run_reads(
    synthetic_cifar, tmp_path, failure
):
    log_root = tmp_path / "run"
    if failure == "tinyimagenet_without_val":
        root = _tiny_imagenet_without_val_annotations(tmp_path)
        args = ["--dataset=tinyimagenet", f"--train_data_path={root}",
                f"--eval_data_path={root}"]  # fmt: skip
        missing = "val_annotations.txt"
    else:
        args = [f"--train_data_path={synthetic_cifar['train']}",
                f"--eval_data_path={tmp_path}/nothing*.bin"]  # fmt: skip
        missing = "nothing*.bin: no file matches"
    failed = run_main(
        [*args, f"--log_root={log_root}", "--batch_size=16", "--train_steps=2"]
    )
    assert failed.returncode == 2, failed.stderr[-2000:]
    errors = [x for x in failed.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1 and missing in errors[0], failed.stderr[-2000:]
    assert not log_root.exists() or not list(log_root.rglob("*")), list(
        log_root.rglob("*")
    )
    # Another run there, CIFAR without --dataset: the defaults, not the
    # failed run's settings.
    second = run_main(train_args(synthetic_cifar, log_root, "--train_steps=2"))
    assert second.returncode == 0, second.stderr[-2000:]
    assert "training resnet20 on cifar10" in second.stderr, second.stderr
    assert "settings from" not in second.stderr
    saved = json.loads((log_root / "config.json").read_text())
    assert saved["config"]["data"]["dataset"] == "cifar10"


@on_one_set  # The run directory's config.json (tests/helpers.py).
def test_settings_taken_from_config_json_are_named_at_the_start(
    synthetic_cifar, tmp_path
):
    first = run_main(
        train_args(synthetic_cifar, tmp_path, "--train_steps=2",
                   "--model=resnet32", "--label_smoothing=0.1")
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    assert "settings from" not in first.stderr
    again = run_main(
        [f"--log_root={tmp_path}", "--train_steps=2", "--label_smoothing=0.2",
         "--dry_run"]
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    (line,) = [x for x in again.stderr.splitlines() if "settings from" in x]
    assert f"settings from {tmp_path}/config.json, not from flags" in line
    assert "--model=resnet32" in line and "--batch_size=16" in line, line
    assert f"--train_data_path={synthetic_cifar['train']}" in line, line
    assert "label_smoothing" not in line and "train_steps" not in line, line
    assert "--dataset=" not in line, line  # The default: no news.


def _saved_run(log_root, **values):
    """A `config.json` in `log_root` as a run of `values` leaves it."""
    config = config_lib.resolve(
        {**flag_values(log_root), **values}, set(values)
    )
    os.makedirs(log_root, exist_ok=True)
    plan = builders.RunPlan(64, 8, 16, 8, 8, 0, 100, 32)
    config_lib.save(config, plan, summaries.atomic_write)


@pytest.mark.parametrize(
    "theirs, ours, said",
    [
        ("course_cifar100", "course_tinyimagenet", "a cifar100 run"),
        ("course_tinyimagenet", "course_cifar100", "a tinyimagenet run"),
    ],
)
def test_a_log_root_of_another_run_is_named_before_the_data(
    tmp_path, theirs, ours, said
):
    """The saved config wins over --preset; a command naming another preset
    is another run, said first with both ways on, not blamed on its data."""
    _saved_run(tmp_path, preset=theirs, train_data_path="their/train")
    values = {**flag_values(tmp_path), "preset": ours}
    with pytest.raises(UserInputError) as refused:
        config_lib.resolve(values, {"preset", "log_root"})
    message = str(refused.value)
    assert message.startswith(f"--log_root={tmp_path} holds {said} (")
    assert f"not a run of --preset={ours} (" in message
    dataset = presets.PRESETS[ours]["dataset"]
    assert (
        f"give another --log_root (e.g. --log_root={tmp_path}_{dataset})"
    ) in message
    assert (
        f"give its own --preset={theirs} --train_data_path=their/train "
        f"--eval_data_path=y --log_root={tmp_path}"
    ) in message
    # --dataset alone asks for another run too; its own preset continues.
    values = {**flag_values(tmp_path), "dataset": "cifar10"}
    with pytest.raises(UserInputError, match="not a run of --dataset=cifar10"):
        config_lib.resolve(values, {"dataset", "log_root"})
    values["preset"] = theirs
    resumed = config_lib.resolve(values, {"preset", "log_root"})
    assert resumed.data.train_data_path == "their/train"


def test_the_resume_line_names_no_default_a_list_holds(tmp_path):
    """A list setting saved at its default (`--lr_decay_fractions`) is no
    news to a resumed run's first line."""
    _saved_run(tmp_path, preset="course_cifar100", batch_size=16)
    values = {**flag_values(tmp_path), "preset": "course_cifar100"}
    values["lr_decay_fractions"] = [0.5, 0.75]  # As the flag holds it.
    assert config_lib.taken_from_saved(values, {"preset", "log_root"}) == {
        "batch_size": 16
    }

"""Recipes end to end: --recipe, EMA and TTA through resume and the eval job."""

import csv

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import flag_values, on_newest_set, run_main, train_args
from tf_resnet.config import layers as config_lib
from tf_resnet.config import presets, settings


def _sums(log_root):
    """|w| and w^2 sums of the model's and the optimizer's float variables."""
    reader = tf.train.load_checkpoint(str(log_root))
    groups = {"model/": [], "optimizer/": []}
    for name, _ in sorted(tf.train.list_variables(str(log_root))):
        for prefix, values in groups.items():
            value = reader.get_tensor(name)
            if name.startswith(prefix) and value.dtype.kind == "f":
                values.append(value)
    return [
        (
            float(sum(np.abs(v).sum() for v in values)),
            float(sum((v * v).sum() for v in values)),
        )
        for values in groups.values()
    ]


def test_the_paper_recipe_trains_exactly_as_before(synthetic_cifar, tmp_path):
    """3 float64 steps; the sums pin the paper recipe as it trains.

    First computed with the code of d960f68, which predates every recipe
    knob; computed again when every training epoch became a permutation of
    the whole split (the order of the examples is part of what they pin;
    the optimizer, loss and schedule did not change). Any change to the
    paper recipe's loss, schedule, optimizer or input pipeline moves these
    sums by far more than the tolerance (which only allows for the order
    of floating-point sums on other CPUs).
    """
    proc = run_main(
        train_args(
            synthetic_cifar,
            tmp_path,
            "--recipe=paper",
            "--train_steps=3",
            "--dtype=float64",
            "--model=resnet20",
        )
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (model_abs, model_sq), (slots_abs, slots_sq) = _sums(tmp_path)
    assert model_abs == pytest.approx(979.0234874597435, rel=1e-7)
    assert model_sq == pytest.approx(1205.0224275848975, rel=1e-7)
    assert slots_abs == pytest.approx(16013.247212842864, rel=1e-7)
    assert slots_sq == pytest.approx(2080.272690293679, rel=1e-7)


def test_recipe_sets_its_knobs_and_explicit_flags_win(tmp_path):
    values = flag_values(tmp_path)
    fast = config_lib.resolve({**values, "recipe": "fast"}, {"recipe"})
    for name, value in presets.RECIPES["fast"].items():
        assert settings.flatten(fast)[name] == value, name
    tuned = config_lib.resolve(
        {**values, "recipe": "fast", "learning_rate": 0.2},
        {"recipe", "learning_rate"},
    )
    assert tuned.optim.learning_rate == 0.2
    assert tuned.optim.lr_schedule == "onecycle"
    paper = config_lib.resolve(values, set())
    assert settings.flatten(paper) == values | {"recipe": "paper"}


@pytest.mark.parametrize(
    "preset",
    [
        "course_cifar100",
        "course_tinyimagenet",
        "course_sync_cifar100",
        "course_async_cifar100",
    ],
)
def test_course_presets_train_with_the_fast_recipe(tmp_path, preset):
    values = flag_values(tmp_path)
    flat = settings.flatten(
        config_lib.resolve({**values, "preset": preset}, set())
    )
    assert flat["recipe"] == "fast"
    own = presets.PRESETS[preset]
    for name, value in presets.RECIPES["fast"].items():
        assert flat[name] == own.get(name, value), name
    # --recipe=paper under a preset: the paper's knobs, the preset's task.
    paper = settings.flatten(
        config_lib.resolve(
            {**values, "preset": preset, "recipe": "paper"}, {"recipe"}
        )
    )
    assert (paper["lr_schedule"], paper["ema_decay"]) == ("step", 0.0)
    assert paper["model"] == "course_resnet"


def _eval_rows(path, column="precision"):
    with open(path, newline="") as stream:
        return {
            int(r["step"]): float(r[column]) for r in csv.DictReader(stream)
        }


# The plain resume runs on both sets (test_training); this one, of the
# run's own knobs, on the newest only (tests/helpers.py).
@on_newest_set
def test_ema_and_tta_survive_a_resume_and_the_eval_job(
    synthetic_cifar, tmp_path
):
    knobs = ["--ema_decay=0.9", "--eval_tta=flip", "--eval_every_steps=4"]
    straight, pieces = tmp_path / "straight", tmp_path / "pieces"
    proc = run_main(
        train_args(synthetic_cifar, straight, "--train_steps=8", *knobs)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for _ in range(2):
        proc = run_main(
            train_args(
                synthetic_cifar,
                pieces,
                "--train_steps=8",
                "--steps_per_run=5",
                *knobs,
            )
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    # The averages are checkpointed and resume like the weights.
    reader = {
        name: tf.train.load_checkpoint(str(root))
        for name, root in (("a", straight), ("b", pieces))
    }
    averages = [
        name
        for name, _ in tf.train.list_variables(str(straight))
        if name.startswith("ema/") and "OPTIMIZER" not in name
    ]
    assert len(averages) > 50
    for name in averages:
        np.testing.assert_allclose(
            reader["a"].get_tensor(name),
            reader["b"].get_tensor(name),
            rtol=1e-5,
            atol=1e-6,
            err_msg=name,
        )
    assert _eval_rows(straight / "eval.csv") == pytest.approx(
        _eval_rows(pieces / "eval.csv")
    )
    # The eval job, given no recipe flag, evaluates the same EMA weights
    # with the same TTA: the same precision as training at the same step.
    job = run_main(
        [
            "--mode=eval",
            "--eval_once",
            f"--log_root={straight}",
            f"--eval_data_path={synthetic_cifar['eval']}",
            f"--eval_dir={tmp_path / 'job'}",
            "--eval_batch_count=2",
        ]
    )
    assert job.returncode == 0, job.stderr[-2000:]
    training = _eval_rows(straight / "eval.csv")
    assert _eval_rows(tmp_path / "job" / "eval.csv") == {8: training[8]}
    # The same job on the raw weights (no EMA, no TTA) scores otherwise.
    raw = run_main(
        [
            "--mode=eval",
            "--eval_once",
            f"--log_root={straight}",
            f"--eval_data_path={synthetic_cifar['eval']}",
            f"--eval_dir={tmp_path / 'raw'}",
            "--eval_batch_count=2",
            "--ema_decay=0",
            "--eval_tta=none",
        ]
    )
    assert raw.returncode == 0, raw.stderr[-2000:]
    loss = _eval_rows(straight / "eval.csv", "loss")[8]
    assert _eval_rows(tmp_path / "raw" / "eval.csv", "loss")[8] != loss

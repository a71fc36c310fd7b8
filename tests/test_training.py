"""The training loop end to end: learning, events, checkpoints, resume."""

import csv
import json
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.engine_runs import assert_same_weights
from tests.helpers import (
    assert_resumed_like_uninterrupted,
    checkpoint_weights,
    eval_rows,
    on_newest_set,
    run_main,
    scalars,
)
from tf_resnet import builders, summaries, train_loop
from tf_resnet.config.settings import make_config
from tf_resnet.distribute import tf_strategy


def config(synthetic, log_root, **overrides):
    values = dict(
        dataset="cifar10",
        train_data_path=synthetic["train"],
        eval_data_path=synthetic["eval"],
        log_root=str(log_root),
        model="resnet20",
        batch_size=32,
        train_steps=40,
        log_every_steps=5,
        eval_every_steps=20,
    )
    values.update(overrides)
    return make_config(**values)


@pytest.fixture(scope="module")
def trained(synthetic_cifar, tmp_path_factory):
    # 80 steps: the paper's schedule decays at 50% and 75% of the run, and
    # 20 steps at the full rate left single-batch losses within their noise
    # of the first (4 seeds of 40 steps: 2 of them learned 20%).
    log_root = tmp_path_factory.mktemp("trained")
    cfg = config(
        synthetic_cifar,
        log_root,
        train_steps=80,
        log_every_steps=10,
        eval_every_steps=40,
    )
    result = train_loop.train(cfg, tf_strategy.default_distributor(cfg.optim))
    return cfg, result


def test_training_learns_and_writes_tensorboard_events(trained):
    cfg, result = trained
    assert result["step"] == 80
    losses = scalars(cfg.run.train_dir, "loss")
    assert [step for step, _ in losses] == [10, 20, 30, 40, 50, 60, 70, 80]
    assert np.mean([v for _, v in losses[-2:]]) < 0.8 * losses[0][1]
    for tag in ("accuracy", "learning_rate", "images_per_sec"):
        assert len(scalars(cfg.run.train_dir, tag)) == 8
    precision = scalars(cfg.run.eval_dir, "Precision")
    best = scalars(cfg.run.eval_dir, "Best Precision")
    assert [step for step, _ in precision] == [40, 80]
    assert best[-1][1] == pytest.approx(max(v for _, v in precision))
    assert precision[-1][1] == pytest.approx(result["precision"])
    assert result["precision"] > 0.2  # 10 classes: chance is 0.1.


def test_eval_csv_and_learning_curve(trained):
    cfg, result = trained
    with open(os.path.join(cfg.run.log_root, "eval.csv"), newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert [int(r["step"]) for r in rows] == [40, 80]
    assert float(rows[-1]["precision"]) == pytest.approx(result["precision"])
    # 1000 training examples / batch 32 = 31 steps per epoch.
    assert float(rows[0]["epoch"]) == pytest.approx(40 / 31, abs=1e-3)
    with open(os.path.join(cfg.run.log_root, "learning_curve.png"), "rb") as s:
        assert s.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_curve_has_training_beside_test_as_keras_history_has(trained):
    """Each row's training loss and accuracy are the means over the batches
    since the evaluation before: the mean of the progress lines' (each over
    10 equal batches) between the two evaluations."""
    cfg, _ = trained
    with open(os.path.join(cfg.run.log_root, "eval.csv"), newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0])[-4:] == [
        "train_accuracy", "train_loss", "split", "examples"
    ]  # fmt: skip
    assert {r["split"] for r in rows} == {"test"}
    for tag, column in (("loss", "train_loss"), ("accuracy", "train_accuracy")):
        lines = dict(scalars(cfg.run.train_dir, tag))
        for row, steps in zip(
            rows, ([10, 20, 30, 40], [50, 60, 70, 80]), strict=True
        ):
            expected = np.mean([lines[s] for s in steps])
            assert float(row[column]) == pytest.approx(expected, rel=1e-4)
    # The plot: an accuracy and a loss panel, each with both splits.
    figure = summaries.EvalHistory(cfg.run.log_root, split="test").figure()
    accuracy, loss = figure.axes
    assert [x.get_label() for x in loss.lines] == ["test", "train"]
    assert [x.get_label() for x in accuracy.lines] == ["test", "train"]
    test_line, train_line = loss.lines
    assert list(train_line.get_ydata()) == pytest.approx(
        [float(r["train_loss"]) for r in rows]
    )
    assert list(test_line.get_ydata()) == pytest.approx(
        [float(r["loss"]) for r in rows]
    )
    assert list(accuracy.lines[1].get_ydata()) == pytest.approx(
        [100 * float(r["train_accuracy"]) for r in rows]
    )
    assert loss.get_ylabel().startswith("loss")


def test_resumed_run_equals_uninterrupted_run(synthetic_cifar, tmp_path):
    straight = config(
        synthetic_cifar,
        tmp_path / "straight",
        train_steps=12,
        eval_every_steps=6,
        eval_batch_count=1,
    )
    train_loop.train(straight, tf_strategy.default_distributor(straight.optim))
    pieces = config(
        synthetic_cifar,
        tmp_path / "pieces",
        train_steps=12,
        eval_every_steps=6,
        eval_batch_count=1,
        steps_per_run=5,
    )
    steps = []
    for _ in range(3):
        mode = tf_strategy.default_distributor(pieces.optim)
        steps.append(train_loop.train(pieces, mode)["step"])
    assert steps == [5, 10, 12]
    assert_resumed_like_uninterrupted(
        tmp_path / "pieces", tmp_path / "straight"
    )
    assert eval_rows(tmp_path / "straight") == eval_rows(tmp_path / "pieces")


def test_eval_mode_evaluates_latest_checkpoint_once(trained, tmp_path):
    cfg, result = trained
    eval_dir = tmp_path / "eval_once"
    proc = run_main(
        [
            "--mode=eval",
            "--eval_once",
            f"--log_root={cfg.run.log_root}",
            f"--eval_dir={eval_dir}",
            f"--eval_data_path={cfg.data.eval_data_path}",
            f"--train_data_path={cfg.data.train_data_path}",
            "--batch_size=32",
            "--dtype=float32",  # As `trained` (auto is bf16 on AMX CPUs).
        ]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    precision = scalars(str(eval_dir), "Precision")
    assert precision == [(80, pytest.approx(result["precision"], abs=1e-6))]
    assert scalars(str(eval_dir), "Best Precision")[0][0] == 80


# On the pinned set `scripts/gpu_check.sh` holds the same two runs to each
# other (tests/test_gpu_paths.py): this one runs on the newest only.
@on_newest_set
def test_mirrored_two_devices_equals_one_device(synthetic_cifar, tmp_path):
    common = [
        f"--train_data_path={synthetic_cifar['train']}",
        f"--eval_data_path={synthetic_cifar['eval']}",
        "--train_steps=3",
        "--batch_size=16",
        "--eval_batch_count=1",
        "--sync_bn",
        "--dtype=float64",
    ]
    one = run_main([*common, f"--log_root={tmp_path / 'one'}"])
    two = run_main(
        [*common, f"--log_root={tmp_path / 'two'}", "--cpu_replicas=2"]
    )
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    assert "over 2 replica(s) (mirrored)" in two.stderr
    a = checkpoint_weights(tmp_path / "one")
    b = checkpoint_weights(tmp_path / "two")
    assert a.keys() == b.keys()
    for name in a:
        # In float64 only summation order differs between 1 and 2 devices.
        # Unsynchronised BN misses this bound by orders of magnitude.
        scale = np.max(np.abs(a[name])) + 1e-12
        assert np.max(np.abs(a[name] - b[name])) <= 1e-9 * scale, name


def micro_batch_training(accumulate_steps, xla=False, steps=3):
    """Weights and step metrics of a few updates of a BatchNorm-free model.

    Momentum SGD with weight decay at batch 16, through the loop's replica
    function (`--accumulate_steps`), on three fixed batches in turn.
    """
    keras.utils.set_random_seed(0)
    cfg = make_config(
        batch_size=16,
        accumulate_steps=accumulate_steps,
        xla=xla,
        learning_rate=0.8,
        weight_decay=0.01,
    )
    mode = tf_strategy.default_distributor(cfg.optim)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, name="logits"),
        ]
    )
    start = [w.copy() for w in model.get_weights()]
    optimizer = builders.build_optimizer(cfg, mode, model, 100)
    step = mode.make_train_step(
        train_loop.make_replica_fn(model, optimizer, mode, cfg)
    )
    rng = np.random.default_rng(0)
    batches = tf.data.Dataset.from_tensor_slices(
        (
            rng.normal(size=(steps, 16, 8, 8, 3)).astype(np.float32),
            rng.integers(0, 10, (steps, 16)).astype(np.int32),
        )
    )
    iterator = iter(batches)
    metrics = [mode.fetch(step(iterator)) for _ in range(steps)]
    return model.get_weights(), metrics, start


@pytest.mark.parametrize("xla", [False, True], ids=["plain", "xla"])
def test_micro_batches_make_the_update_of_the_whole_batch(xla):
    """Without BatchNorm, 4 micro-batches of 4 are one batch of 16."""
    whole, whole_metrics, start = micro_batch_training(1)
    micro, micro_metrics, _ = micro_batch_training(4, xla=xla)
    assert_same_weights(micro, whole, start)
    for ours, theirs in zip(micro_metrics, whole_metrics, strict=True):
        assert ours["examples"] == theirs["examples"] == 16
        assert ours["correct"] == theirs["correct"]
        assert ours["loss_sum"] == pytest.approx(theirs["loss_sum"], 1e-5)


def test_a_run_with_micro_batches_trains_and_saves(synthetic_cifar, tmp_path):
    proc = run_main(
        [
            f"--train_data_path={synthetic_cifar['train']}",
            f"--eval_data_path={synthetic_cifar['eval']}",
            f"--log_root={tmp_path}",
            "--batch_size=8",
            "--accumulate_steps=2",
            "--train_steps=3",
            "--log_every_steps=1",
            "--eval_batch_count=1",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "each replica's batch in 2 micro-batches of 4" in proc.stderr
    assert len(re.findall(r"step \d/3 .*: loss \d", proc.stderr)) == 3
    assert os.path.exists(tmp_path / "ckpt-3.index")
    with open(tmp_path / "config.json") as stream:
        assert json.load(stream)["config"]["optim"]["accumulate_steps"] == 2

"""The evaluation report: top-5, per-class accuracy, the confusion matrix.

Also the eval job next to a training run (each keeps its own eval.csv and
plot), a checkpoint deleted under the eval job, and the run's flags in the
HParams plugin.
"""

import csv
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from tests.helpers import ROOT, run_main
from tf_resnet import (
    builders,
    eval_report,
    evaluation,
    summaries,
    train_loop,
)
from tf_resnet.config import layers as config_lib
from tf_resnet.config import settings, validation
from tf_resnet.distribute import tf_strategy
from tf_resnet.distribute.base import TrainState

NAMES = [f"class {i}" for i in range(9)] + ["dog, small"]  # CSV quoting.
# (bright channel, label) of each test record. The model below predicts the
# bright channel's index; its top 5 are that class and classes 3, 4, 5, 6.
RECORDS = [
    (0, 0), (0, 0), (0, 1), (1, 1), (1, 3), (2, 2),
    (2, 9), (0, 5), (1, 6), (2, 4), (2, 2),
]  # fmt: skip
# By hand: rows are labels, columns the predicted (bright) channel.
EXPECTED = {(0, 0): 2, (1, 0): 1, (1, 1): 1, (3, 1): 1, (2, 2): 2,
            (9, 2): 1, (5, 0): 1, (6, 1): 1, (4, 2): 1}  # fmt: skip
CORRECT = 5  # (0, 0) twice, (1, 1), (2, 2) twice.
IN_TOP_5 = 9  # All but (0, 1) and (2, 9).


def write_records(path):
    """CIFAR-10 records: one channel at 255, the others 0."""
    images = np.zeros((len(RECORDS), 32, 32, 3), np.uint8)
    for index, (channel, _) in enumerate(RECORDS):
        images[index, :, :, channel] = 255
    labels = np.array([label for _, label in RECORDS], np.uint8)
    planes = images.transpose(0, 3, 1, 2).reshape(len(RECORDS), -1)
    with open(path, "wb") as stream:
        stream.write(np.concatenate([labels[:, None], planes], 1).tobytes())


def channel_model():
    """Logits: the mean of channel c for classes 0-2, -0.01 * j beyond.

    After per-image standardisation the bright channel's mean is +1.41 and
    the others' -0.71, so the top class is the bright channel and the next
    four are 3, 4, 5, 6 (-0.03 ... -0.06).
    """
    inputs = keras.Input((32, 32, 3))
    pooled = keras.layers.GlobalAveragePooling2D()(inputs)
    logits = keras.layers.Dense(10)(pooled)
    model = keras.Model(inputs, logits)
    kernel = np.zeros((3, 10), np.float32)
    kernel[[0, 1, 2], [0, 1, 2]] = 1.0
    bias = np.array([0, 0, 0] + [-0.01 * j for j in range(3, 10)], np.float32)
    model.layers[-1].set_weights([kernel, bias])
    return model


def tensors(directory, tag):
    accumulator = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    return [
        (event.step, tf.make_ndarray(event.tensor_proto))
        for event in accumulator.Tensors(tag)
    ]


def read_csv(path):
    with open(path, newline="") as stream:
        return list(csv.reader(stream))


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """One evaluation at step 7 of the channel model by the `Evaluator`."""
    folder = tmp_path_factory.mktemp("report")
    write_records(folder / "test_batch.bin")
    cfg = settings.make_config(
        eval_data_path=str(folder / "test_batch.bin"),
        log_root=str(folder / "log"),
        batch_size=4,  # Three batches, the last one partial.
    )
    os.makedirs(cfg.run.log_root)
    plan = builders.RunPlan(100, 10, 100, 10, 10, 0, 10, 32, NAMES)
    config_lib.save(cfg, plan, summaries.atomic_write)  # Names the classes.
    mode = tf_strategy.default_distributor(cfg.optim)
    evaluator = evaluation.Evaluator(cfg, mode, TrainState(channel_model()))
    result = evaluator(7, 0.7)
    evaluator.close()
    return cfg, result


def test_precision_top_5_and_the_confusion_matrix_by_hand(evaluated):
    cfg, result = evaluated
    assert result["examples"] == len(RECORDS)
    assert result["precision"] == pytest.approx(CORRECT / len(RECORDS))
    assert result["precision_at_5"] == pytest.approx(IN_TOP_5 / len(RECORDS))
    header, *rows = read_csv(
        os.path.join(cfg.run.eval_dir, "confusion_matrix.csv")
    )
    assert header == ["true \\ predicted", *NAMES]
    assert [row[0] for row in rows] == NAMES
    expected = np.zeros((10, 10), int)
    for (label, predicted), count in EXPECTED.items():
        expected[label, predicted] = count
    np.testing.assert_array_equal(
        [[int(v) for v in row[1:]] for row in rows], expected
    )


def test_per_class_csv(evaluated):
    cfg, _ = evaluated
    with open(os.path.join(cfg.run.eval_dir, "per_class.csv")) as stream:
        rows = list(csv.DictReader(stream))
    got = [
        (r["name"], r["examples"], r["correct"], r["accuracy"],
         r["most_confused_with"], r["confused_count"])
        for r in rows
    ]  # fmt: skip
    assert got == [
        ("class 0", "2", "2", "1.000000", "", "0"),
        ("class 1", "2", "1", "0.500000", "class 0", "1"),
        ("class 2", "2", "2", "1.000000", "", "0"),
        ("class 3", "1", "0", "0.000000", "class 1", "1"),
        ("class 4", "1", "0", "0.000000", "class 2", "1"),
        ("class 5", "1", "0", "0.000000", "class 0", "1"),
        ("class 6", "1", "0", "0.000000", "class 1", "1"),
        ("class 7", "0", "0", "", "", "0"),
        ("class 8", "0", "0", "", "", "0"),
        ("dog, small", "1", "0", "0.000000", "class 2", "1"),
    ]


def test_eval_csv_column_and_tensorboard_events(evaluated):
    cfg, _ = evaluated
    with open(os.path.join(cfg.run.log_root, "eval.csv")) as stream:
        (row,) = csv.DictReader(stream)
    assert row["step"] == "7"
    assert float(row["precision_at_5"]) == pytest.approx(9 / 11, abs=1e-6)
    ((step, value),) = tensors(cfg.run.eval_dir, "Precision@5")
    assert step == 7 and float(value) == pytest.approx(9 / 11)
    ((step, image),) = tensors(cfg.run.eval_dir, "confusion_matrix")
    width, height, png = image  # The image plugin's [w, h, png...] strings.
    decoded = tf.image.decode_png(png).numpy()
    assert step == 7 and decoded.shape[:2] == (int(height), int(width))
    assert decoded.std() > 10  # Not a blank image.
    path = os.path.join(cfg.run.eval_dir, "confusion_matrix.png")
    with open(path, "rb") as stream:
        on_disk = tf.image.decode_png(stream.read()).numpy()
    assert on_disk.shape[:2] == decoded.shape[:2]


def test_a_cut_evaluation_records_its_images_and_the_title_its_task(
    tmp_path,
):
    """`--eval_batch_count` cuts the evaluation short: its row says to how
    many images; the plot's title names the model, the data and the engine.
    """
    write_records(tmp_path / "test_batch.bin")
    cfg = settings.make_config(
        eval_data_path=str(tmp_path / "test_batch.bin"),
        log_root=str(tmp_path / "log"),
        batch_size=4,
        eval_batch_count=2,
    )
    mode = tf_strategy.default_distributor(cfg.optim)
    evaluator = evaluation.Evaluator(cfg, mode, TrainState(channel_model()))
    assert evaluator(3, 0.3)["examples"] == 8
    evaluator.close()
    with open(os.path.join(cfg.run.log_root, "eval.csv")) as stream:
        (row,) = csv.DictReader(stream)
    assert row["examples"] == "8"
    figure = summaries.EvalHistory(
        cfg.run.log_root, title=evaluator.history.title
    ).figure()
    assert figure._suptitle.get_text() == (
        "resnet20 on cifar10, engine default"
    )


# A course_cifar100 run of 30 steps at batch 128 on 640 random CIFAR-100
# records (2026-11-28, Intel Xeon with AMX-BF16): (epoch, test loss, train
# loss). The first tests are 10^2-10^8 while the batch-norm statistics lag
# the weights (docs/recipes.md, "The first evaluations").
SHORT_RUN = [
    (1, 128416768.0, 9.187), (2, 198577.0, 9.357), (3, 930.43, 7.700),
    (4, 35.63, 7.577), (5, 4.750, 6.969), (6, 4.606, 6.158),
]  # fmt: skip


def test_the_loss_panel_of_a_short_run_shows_both_curves(tmp_path):
    """Test losses far above training's are marks on the axis's top edge,
    with their values; the axis spans training's curve, not 10^8."""
    history = summaries.EvalHistory(str(tmp_path))
    for epoch, loss, train in SHORT_RUN:
        history.record(5 * epoch, epoch, 0.01, loss, train={
            "accuracy": 0.01, "loss": train
        })  # fmt: skip
    _, loss = history.figure().axes
    top = loss.get_ylim()[1]
    train_losses = [train for _, _, train in SHORT_RUN]
    assert max(train_losses) < top <= 3.5 * max(train_losses)
    test_line, train_line = loss.lines
    assert list(train_line.get_ydata()) == pytest.approx(train_losses)
    drawn = [v for v in test_line.get_ydata() if np.isfinite(v)]
    assert drawn == pytest.approx([4.750, 4.606])
    (marks,) = loss.collections
    assert [x for x, _ in marks.get_offsets()] == [1, 2, 3, 4]
    assert [t.get_text() for t in loss.texts] == [
        "1.28e+08", "1.99e+05", "930", "35.6"
    ]  # fmt: skip
    # Without such points the axis fits every point, unmarked.
    calm = summaries.EvalHistory(str(tmp_path / "calm"))
    calm.record(5, 1, 0.5, 4.0, train={"accuracy": 0.5, "loss": 5.0})
    calm.record(10, 2, 0.6, 14.0, train={"accuracy": 0.6, "loss": 4.5})
    _, loss = calm.figure().axes
    assert loss.get_ylim()[1] >= 14.0 and not loss.collections


def test_without_names_the_axes_are_the_indices(tmp_path):
    confusion = np.array([[3, 1], [0, 2]])
    eval_report.write_report(str(tmp_path), 1, confusion, names=None)
    rows = read_csv(tmp_path / "confusion_matrix.csv")
    assert rows == [["true \\ predicted", "0", "1"], ["0", "3", "1"],
                    ["1", "0", "2"]]  # fmt: skip


def test_with_many_classes_the_plot_shows_the_most_confused(tmp_path):
    confusion = np.diag(np.full(200, 50))
    pairs = {(17, 140): 9, (140, 17): 4, (3, 199): 6, (60, 61): 2}
    pairs.update({(100 + i, 20 + i): 1 for i in range(30)})
    for (true, predicted), count in pairs.items():
        confusion[true, predicted] = count
    shown = eval_report.most_confused(confusion)
    assert len(shown) == 20
    assert {17, 140, 3, 199, 60, 61} <= set(shown)
    image = eval_report.write_report(str(tmp_path), 5, confusion)
    height, width = tf.image.decode_png(image).shape[:2]
    assert width == height <= 1100  # 20 rows, not 200.
    assert (tmp_path / "confusion_matrix.png").read_bytes() == image


def start_main(args, log_path):
    """resnet_main.py in the background, in its own process group."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "resnet_main.py"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            cwd=ROOT,
            start_new_session=True,
        )


def eval_steps(path):
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as stream:
        return {int(r["step"]): r for r in csv.DictReader(stream)}


@pytest.fixture(scope="module")
def side_by_side(synthetic_cifar, tmp_path_factory):
    """Training and the eval job running together on one log_root.

    Training runs to step 10, then continues to 20 while the eval job
    (started before) evaluates the new checkpoints.
    """
    log_root = tmp_path_factory.mktemp("side_by_side")
    eval_dir = log_root / "eval_job"
    common = [
        f"--log_root={log_root}",
        f"--eval_data_path={synthetic_cifar['eval']}",
        "--eval_batch_count=2",
        "--dtype=float32",
    ]
    train = [
        *common,
        f"--train_data_path={synthetic_cifar['train']}",
        "--batch_size=16",
        "--train_steps=20",
        "--eval_every_steps=10",
        "--checkpoint_every_steps=5",
        "--learning_rate=0.05",
    ]
    first = run_main([*train, "--steps_per_run=10"])
    assert first.returncode == 0, first.stderr[-2000:]
    job = start_main(
        [*common, "--mode=eval", f"--eval_dir={eval_dir}",
         "--eval_timeout_secs=300"],
        log_root / "job.log",
    )  # fmt: skip
    try:
        second = start_main(train, log_root / "train.log")
        assert second.wait(timeout=300) == 0, (
            log_root / "train.log"
        ).read_text()
        deadline = time.time() + 120
        while 20 not in eval_steps(eval_dir / "eval.csv"):
            assert job.poll() is None, (log_root / "job.log").read_text()
            assert time.time() < deadline, (log_root / "job.log").read_text()
            time.sleep(0.5)
        assert job.poll() is None  # Still waiting for checkpoints.
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return log_root, eval_dir


def test_training_and_the_eval_job_keep_their_own_history(side_by_side):
    log_root, eval_dir = side_by_side
    training = eval_steps(log_root / "eval.csv")
    job = eval_steps(eval_dir / "eval.csv")
    assert sorted(training) == [10, 20]
    assert 20 in job and set(job) <= {5, 10, 15, 20}
    # The same checkpoint and test batches: the same precision.
    for step in set(job) & {10, 20}:
        assert job[step]["precision"] == training[step]["precision"]
        assert job[step]["epoch"] == training[step]["epoch"]
    for folder in (log_root, eval_dir):
        with open(folder / "learning_curve.png", "rb") as stream:
            assert stream.read(8) == b"\x89PNG\r\n\x1a\n"
    # Training's curve continues over its resume at step 10, training
    # columns and all; the job's rows take training's of the same step.
    assert all(training[s]["train_accuracy"] for s in (10, 20)), training
    assert all(training[s]["train_loss"] for s in (10, 20)), training
    assert job[10]["train_accuracy"] == training[10]["train_accuracy"]
    for step in set(job) - set(training):
        assert not job[step]["train_accuracy"], job[step]
    # The job's own points are drawn over training's, with their own mark.
    figure = summaries.EvalHistory(
        str(eval_dir), label="eval job",
        compare={"training": str(log_root / "eval.csv")},
    ).figure()  # fmt: skip
    accuracy, loss = figure.axes
    for axes in (accuracy, loss):
        lines = {x.get_label(): x for x in axes.lines}
        assert set(lines) == {
            "training test", "training train", "eval job test"
        }, set(lines)  # fmt: skip
        own = lines["eval job test"]
        assert own.get_marker() == "D"
        assert own.get_zorder() > lines["training test"].get_zorder()
        assert len(own.get_xdata()) == len(job)
    # The training run's report is in its eval dir, the job's in its own.
    assert (log_root / "eval" / "confusion_matrix.csv").exists()
    assert (eval_dir / "confusion_matrix.csv").exists()


def test_the_run_logs_its_flags_for_the_hparams_dashboard(side_by_side):
    log_root, _ = side_by_side
    accumulator = event_accumulator.EventAccumulator(str(log_root))
    accumulator.Reload()
    content = accumulator.PluginTagToContent("hparams")
    starts = [
        plugin_data_pb2.HParamsPluginData.FromString(data).session_start_info
        for data in content.values()
    ]
    (start,) = [s for s in starts if s.hparams]  # Also written on resume.
    hparams = start.hparams
    assert hparams["learning_rate"].number_value == pytest.approx(0.05)
    assert hparams["batch_size"].number_value == 16
    assert hparams["model"].string_value == "resnet20"
    assert hparams["lr_decay_fractions"].string_value == "[0.5, 0.75]"
    assert hparams["image_size"].string_value == "null"
    assert set(settings.FIELD_NAMES) <= set(hparams)


def test_a_checkpoint_deleted_before_its_restore_is_skipped(
    synthetic_cifar, tmp_path, monkeypatch, caplog
):
    """Training's `--keep_checkpoints=1` deletes the one the job was given."""
    values = dict(
        train_data_path=synthetic_cifar["train"],
        eval_data_path=synthetic_cifar["eval"],
        log_root=str(tmp_path),
        batch_size=16,
        train_steps=2,
        checkpoint_every_steps=1,
        eval_batch_count=1,
        keep_checkpoints=1,
        dtype="float32",
    )
    config = settings.make_config(**values)
    mode = tf_strategy.default_distributor(config.optim)
    train_loop.train(config, mode)
    next_run = settings.make_config(**{**values, "train_steps": 3})
    checkpoint_paths = evaluation._checkpoint_paths

    def train_on_after_the_first(run):
        """The real iterator; training saves ckpt-3 after it names ckpt-2."""
        for index, path in enumerate(checkpoint_paths(run)):
            if index == 0:
                train_loop.train(next_run, mode)
                assert not tf.io.gfile.glob(path + ".*")  # max_to_keep=1.
            yield path

    monkeypatch.setattr(
        evaluation, "_checkpoint_paths", train_on_after_the_first
    )
    job = settings.make_config(
        **values,
        mode="eval",
        eval_dir=str(tmp_path / "job"),
        eval_timeout_secs=1,
    )
    with caplog.at_level("WARNING"):
        evaluation.evaluate_only(job, mode)
    assert list(eval_steps(tmp_path / "job" / "eval.csv")) == [3]
    assert "ckpt-2: skipped, deleted before it could be restored" in (
        caplog.text
    )


def test_the_eval_job_refuses_log_root_as_its_eval_dir(tmp_path):
    cfg = settings.make_config(
        mode="eval",
        log_root=str(tmp_path),
        eval_dir=str(tmp_path) + "/.",
        eval_data_path=str(tmp_path / "test_batch.bin"),
    )
    with pytest.raises(ValueError, match="is --log_root"):
        validation.validate(cfg)

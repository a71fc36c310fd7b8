"""--mode=export: a SavedModel that scores raw images like the training model.

Runs of 3 steps on the synthetic data are exported by `resnet_main.py`;
their SavedModels run in a fresh Python that cannot import tf_resnet, and
are compared with the training model restored here (tests/exported.py).
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import exported
from tests.exported import TrainingModel
from tests.helpers import on_newest_set, run_main
from tf_resnet import summaries

# Each trains its own run; the second has every knob that export must
# carry into the graph, the third a checkpoint in float64 and an input
# size other than the stored one.
VARIANTS = {
    "paper": ["--checkpoint_every_steps=1"],
    "ema_flip_dataset": [
        "--ema_decay=0.9",
        "--eval_tta=flip",
        "--normalization=dataset",
    ],
    "float64_resized": ["--dtype=float64", "--image_size=40"],
}
TOLERANCE = 1e-5


class Runs:
    """Trains and exports each variant once per module, when first asked."""

    def __init__(self, synthetic, tmp_path_factory):
        self.synthetic = synthetic
        self.tmp_path_factory = tmp_path_factory
        self.runs = {}

    def get(self, name):
        if name not in self.runs:
            root = self.tmp_path_factory.mktemp(name)
            log_root = str(root / "run")
            export_dir = str(root / "export")
            exported.train(self.synthetic, log_root, VARIANTS[name])
            proc = exported.export(log_root, export_dir)
            assert proc.returncode == 0, proc.stderr[-3000:]
            self.runs[name] = (log_root, export_dir)
        return self.runs[name]


@pytest.fixture(scope="module")
def runs(synthetic_cifar, tmp_path_factory):
    return Runs(synthetic_cifar, tmp_path_factory)


@pytest.fixture(params=list(VARIANTS))
def variant(request, runs):
    log_root, export_dir = runs.get(request.param)
    return request.param, log_root, export_dir


def test_saved_model_scores_raw_images_like_the_training_model(
    variant, synthetic_cifar, tmp_path
):
    name, log_root, export_dir = variant
    records, _ = exported.read_cifar10_records(synthetic_cifar["eval"])
    records = records[:40]
    # Neither the stored size nor the model's, and not square.
    odd = np.random.default_rng(5).integers(
        0, 256, size=(6, 45, 27, 3), dtype=np.uint8
    )
    served = exported.serve_in_fresh_process(
        export_dir, tmp_path, records=records, odd=odd
    )
    reference = TrainingModel(log_root)
    for key, images in (("records", records), ("odd", odd)):
        probabilities, classes = served[key]
        assert probabilities.dtype == np.float32
        assert probabilities.shape == (len(images), 10)
        np.testing.assert_allclose(
            probabilities,
            reference.probabilities(images),
            rtol=0,
            atol=TOLERANCE,
            err_msg=f"{name}: {key}",
        )
        np.testing.assert_array_equal(classes, probabilities.argmax(-1))
    if name == "ema_flip_dataset":
        # The export would fail the comparison above without the moving
        # average or the flip: each changes the probabilities.
        probabilities = served["records"][0]
        raw = TrainingModel(log_root, use_ema=False)
        for other in (
            raw.probabilities(records),
            reference.probabilities(records, tta="none"),
        ):
            assert np.abs(probabilities - other).max() > 100 * TOLERANCE


def test_export_writes_keras_model_labels_and_facts(variant, synthetic_cifar):
    name, log_root, export_dir = variant
    assert {"saved_model.pb", "variables", "model.keras"} <= set(
        os.listdir(export_dir)
    )
    with open(os.path.join(synthetic_cifar["folder"], "batches.meta.txt")) as f:
        names = f.read().split()
    with open(os.path.join(export_dir, "labels.txt")) as f:
        assert f.read().splitlines() == names
    with open(os.path.join(export_dir, "export.json")) as f:
        facts = json.load(f)
    eval_csv = summaries.read_eval_csv(os.path.join(log_root, "eval.csv"))
    reference = TrainingModel(log_root)
    config = reference.config
    assert facts["model"] == "resnet20" and facts["dataset"] == "cifar10"
    assert facts["step"] == 3
    assert facts["test_accuracy"] == float(eval_csv[3]["precision"])
    assert facts["image_size"] == (40 if name == "float64_resized" else 32)
    assert facts["normalization"] == config.data.normalization
    assert facts["eval_tta"] == config.optim.eval_tta
    assert facts["ema"] == reference.has_ema
    assert facts["cifar_record"]["record_bytes"] == 3073

    # The .keras file: the network alone, normalised inputs to logits
    # (float32 logits of ~30 against float64 ones: a relative tolerance).
    model = keras.saving.load_model(os.path.join(export_dir, "model.keras"))
    images, _ = exported.read_cifar10_records(synthetic_cifar["eval"])
    inputs = reference.inputs(images[:8])
    np.testing.assert_allclose(
        model(tf.cast(inputs, tf.float32), training=False).numpy(),
        reference.model(inputs, training=False).numpy(),
        rtol=TOLERANCE,
        atol=TOLERANCE,
    )
    assert model.dtype_policy.name == "float32"


@on_newest_set  # A flag's check (tests/helpers.py).
def test_checkpoint_flag_exports_an_older_checkpoint(
    runs, synthetic_cifar, tmp_path
):
    log_root, latest_dir = runs.get("paper")
    export_dir = str(tmp_path / "step2")
    checkpoint = os.path.join(log_root, "ckpt-2")
    proc = exported.export(log_root, export_dir, f"--checkpoint={checkpoint}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(export_dir, "export.json")) as f:
        facts = json.load(f)
    assert facts["step"] == 2
    assert facts["test_accuracy"] is None  # Not evaluated at step 2.
    images, _ = exported.read_cifar10_records(synthetic_cifar["eval"])
    images = tf.constant(images[:20])
    probabilities = {
        name: tf.saved_model.load(folder)
        .signatures["serving_default"](images=images)["probabilities"]
        .numpy()
        for name, folder in (("step2", export_dir), ("latest", latest_dir))
    }
    expected = TrainingModel(log_root, checkpoint).probabilities(images.numpy())
    np.testing.assert_allclose(
        probabilities["step2"], expected, rtol=0, atol=TOLERANCE
    )
    difference = np.abs(probabilities["step2"] - probabilities["latest"])
    assert difference.max() > 100 * TOLERANCE


@on_newest_set  # The export folder's files (tests/helpers.py).
def test_export_replaces_an_earlier_export_not_other_files(runs, tmp_path):
    log_root, _ = runs.get("paper")
    export_dir = tmp_path / "export"
    for _ in range(2):
        proc = exported.export(log_root, str(export_dir))
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.listdir(tmp_path) == ["export"]  # No temporary folder left.

    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine")
    proc = exported.export(log_root, str(foreign))
    assert proc.returncode == 2
    assert "holds other files" in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(foreign) == ["todo.txt"]
    assert sorted(os.listdir(tmp_path)) == ["export", "notes"]


@on_newest_set  # A check of flags (tests/helpers.py).
@pytest.mark.parametrize(
    "args, message",
    [
        (["--mode=export"], "--mode=export needs --export_dir"),
        (["--mode=export", "--export_dir=EXPORT"], "no checkpoint to export"),
        (
            [
                "--mode=export",
                "--export_dir=EXPORT",
                "--checkpoint=LOG/ckpt-9",
            ],
            "--checkpoint=LOG/ckpt-9: not a readable checkpoint",
        ),
        (
            ["--export_dir=EXPORT", "--eval_data_path=x"],
            "--export_dir only makes sense with --mode=export",
        ),
    ],
)
def test_export_errors_name_the_problem(tmp_path, args, message):
    log_root = tmp_path / "run"
    log_root.mkdir()
    export_dir = tmp_path / "export"

    def fill(text):
        return text.replace("EXPORT", str(export_dir)).replace(
            "LOG", str(log_root)
        )

    proc = run_main([f"--log_root={log_root}", *map(fill, args)])
    assert proc.returncode == 2
    error_lines = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(error_lines) == 1 and fill(message) in error_lines[0], (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not export_dir.exists()
    assert os.listdir(log_root) == []

"""--mode=export --litert: model.tflite beside the SavedModel, and predict.

The shared `exported_run` (conftest.py, 40 steps with flip TTA and dataset
normalisation) is exported once per kind with `resnet_main.py`; the
`.tflite` is compared with the SavedModel of the same export on the
synthetic test images. The bounds are for this barely trained model,
whose close probabilities make top-1 fragile; a trained ResNet's figures
are in bench/results/litert.md.
"""

import csv
import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tests import exported
from tests.helpers import ON_PINNED_SET, ROOT, on_newest_set
from tf_resnet import export, litert, predict
from tf_resnet.config import settings, validation
from tf_resnet.errors import UserInputError

# Top-1 agreement with the SavedModel, and the largest probability
# difference, on the 200 synthetic test images.
BOUNDS = {"float": (0.99, 1e-4), "int8": (0.90, 0.08)}


class Exports:
    """Exports the shared run once per kind, when first asked."""

    def __init__(self, log_root, root):
        self.log_root = log_root
        self.root = root
        self.done = {}

    def get(self, kind):
        if kind not in self.done:
            export_dir = str(self.root / kind)
            proc = exported.export(
                self.log_root, export_dir, f"--litert={kind}"
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            self.done[kind] = (export_dir, proc.stdout)
        return self.done[kind]


@pytest.fixture(scope="module")
def exports(exported_run, tmp_path_factory):
    return Exports(exported_run[0], tmp_path_factory.mktemp("litert"))


@pytest.fixture(params=["float", "int8"])
def kind(request):
    return request.param


def facts_of(export_dir):
    with open(os.path.join(export_dir, "export.json")) as f:
        return json.load(f)


def saved_model_probabilities(export_dir, images):
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    return serve(images=tf.constant(images))["probabilities"].numpy()


def test_export_writes_the_tflite_its_facts_and_its_evaluation(
    exports, kind, synthetic_cifar
):
    export_dir, stdout = exports.get(kind)
    facts = facts_of(export_dir)["litert"]
    path = os.path.join(export_dir, "model.tflite")
    assert facts["file"] == "model.tflite" and facts["format"] == kind
    assert facts["bytes"] == os.path.getsize(path)
    assert facts["input"] == {
        "name": "images",
        "dtype": "uint8",
        "shape": [-1, 32, 32, 3],
    }
    if kind == "int8":
        assert facts["calibration"] == {
            "path": synthetic_cifar["train"],
            "images": litert.CALIBRATION_IMAGES,
        }
    else:
        assert facts["calibration"] is None
    evaluation = facts["evaluation"]
    assert evaluation["images"] == 200
    assert evaluation["path"] == synthetic_cifar["eval"]
    lines = stdout.splitlines()
    assert lines[0].startswith(f"LiteRT {kind} against the SavedModel on 200")
    assert lines[2].startswith("SavedModel") and lines[3].startswith("LiteRT")
    assert f"{100 * evaluation['litert']['top1']:5.1f}%" in lines[3]


def test_tflite_agrees_with_the_saved_model(exports, kind, synthetic_cifar):
    export_dir, _ = exports.get(kind)
    images, labels = exported.read_cifar10_records(synthetic_cifar["eval"])
    with open(os.path.join(export_dir, "model.tflite"), "rb") as f:
        flatbuffer = f.read()
    converted = litert.probabilities(flatbuffer, images)
    reference = saved_model_probabilities(export_dir, images)
    agreement = np.mean(converted.argmax(-1) == reference.argmax(-1))
    least, tolerance = BOUNDS[kind]
    assert agreement >= least
    assert np.abs(converted - reference).max() <= tolerance
    assert len(set(reference.argmax(-1).tolist())) >= 3
    evaluation = facts_of(export_dir)["litert"]["evaluation"]
    assert evaluation["top1_agreement"] == pytest.approx(agreement)
    assert evaluation["litert"]["top1"] == pytest.approx(
        np.mean(converted.argmax(-1) == labels)
    )
    if kind == "int8":
        assert litert.float_ops(flatbuffer) == []
        interpreter_class, _ = predict.litert_interpreter()
        interpreter = interpreter_class(model_content=flatbuffer)
        (image_input,) = interpreter.get_input_details()
        assert image_input["dtype"] == np.uint8
        assert image_input["quantization"] == (1.0, 0)  # Raw pixels.
        float_bytes = facts_of(exports.get("float")[0])["litert"]["bytes"]
        assert len(flatbuffer) <= 0.35 * float_bytes


def test_predict_classifies_images_and_records_in_a_fresh_process(
    exports, kind, synthetic_cifar, tmp_path
):
    export_dir, _ = exports.get(kind)
    images, labels = exported.read_cifar10_records(synthetic_cifar["eval"])
    files = []
    for index, size in ((0, (32, 32)), (1, (48, 40))):
        path = str(tmp_path / f"image{index}.png")
        Image.fromarray(images[index]).resize(size, Image.BILINEAR).save(path)
        files.append(path)
    output = tmp_path / "preds.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tf_resnet.predict",
            f"--model_dir={export_dir}",
            "--format=litert",
            f"--output={output}",
            *files,
            synthetic_cifar["eval"],
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Both requirement sets pin ai-edge-litert: no fallback, no notice.
    assert "tf.lite.Interpreter" not in proc.stderr
    with open(output, newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == len(files) + len(labels)
    assert len(proc.stdout.splitlines()) == len(rows)
    assert [r["file"] for r in rows[:2]] == files
    records = rows[2:]
    assert [int(r["record"]) for r in records] == list(range(len(labels)))
    assert [int(r["label"]) for r in records] == labels.tolist()
    top1 = np.array([int(r["class_1"]) for r in records])
    reference = saved_model_probabilities(export_dir, images).argmax(-1)
    assert np.mean(top1 == reference) >= BOUNDS[kind][0]
    # The image of the input size is the first record's pixels.
    assert rows[0]["class_1"] == records[0]["class_1"]
    assert rows[0]["probability_1"] == records[0]["probability_1"]


def test_corrupt_tflite_is_one_clear_error(exports, tmp_path, capsys):
    export_dir = str(tmp_path / "export")
    shutil.copytree(exports.get("float")[0], export_dir)
    path = os.path.join(export_dir, "model.tflite")
    with open(path, "r+b") as stream:
        stream.truncate(1000)
    image = str(tmp_path / "image.png")
    Image.new("RGB", (32, 32)).save(image)
    code = predict.main([f"--model_dir={export_dir}", "--format=litert", image])
    assert code == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(errors) == 1, errors
    assert f"{path}: not a readable LiteRT model" in errors[0]


def tiny_model():
    """A tiny network standing in for the run's: conversion in seconds."""
    inputs = keras.Input((32, 32, 3))
    features = keras.layers.GlobalAveragePooling2D()(
        keras.layers.Conv2D(4, 3)(inputs)
    )
    return keras.Model(inputs, keras.layers.Dense(10)(features))


def test_per_image_standardisation_in_int8_is_fully_integer_or_an_error():
    # TensorFlow 2.18's converter leaves its SQRT and DIV in float32
    # (an error naming them); 2.21's quantises them.
    model = tiny_model()
    config = settings.make_config(normalization="per_image")
    serve = export.serving_function(model, config, 32)
    calibration = np.random.default_rng(0).integers(
        0, 256, (8, 32, 32, 3), dtype=np.uint8
    )

    def convert():
        return litert.convert(
            model, serve, 32, "int8", calibration, "per_image"
        )

    if not ON_PINNED_SET:
        assert litert.float_ops(convert()) == []
        return
    with pytest.raises(UserInputError) as error:
        convert()
    message = str(error.value)
    assert message.startswith("--litert=int8: SQRT, MAXIMUM, DIV")
    assert "would run in float32" in message
    assert "--normalization=dataset" in message


def test_float_ops_left_by_the_converter_are_one_clear_error(exports):
    # Whatever the TensorFlow: the float model is all float ops.
    with open(os.path.join(exports.get("float")[0], "model.tflite"), "rb") as f:
        flatbuffer = f.read()
    assert {"CONV_2D", "SOFTMAX"} <= set(litert.float_ops(flatbuffer))
    with pytest.raises(UserInputError) as error:
        litert._check_fully_integer(flatbuffer, "dataset")
    message = str(error.value)
    assert message.startswith("--litert=int8: ") and "CONV_2D" in message
    assert message.endswith("not be fully integer; export --litert=float")


def test_litert_without_a_checkpoint_or_outside_export_is_refused(tmp_path):
    # In this process: resnet_main.py prints these errors as one line
    # (test_export.py), and the calibration error below goes through it.
    log_root = tmp_path / "run"
    log_root.mkdir()
    export_dir = tmp_path / "export"
    config = settings.make_config(
        mode="export",
        log_root=str(log_root),
        export_dir=str(export_dir),
        litert="int8",
    )
    with pytest.raises(UserInputError, match="no checkpoint to export"):
        export.export(config, str(export_dir))
    assert not export_dir.exists()
    with pytest.raises(
        UserInputError, match="--litert only makes sense with --mode=export"
    ):
        validation.validate(
            settings.make_config(
                litert="float", train_data_path="x", eval_data_path="y"
            )
        )


@on_newest_set  # A check of flags (tests/helpers.py).
def test_int8_without_calibration_data_is_one_clear_error(
    exported_run, tmp_path
):
    log_root, _ = exported_run
    export_dir = tmp_path / "export"
    missing = str(tmp_path / "gone" / "data_batch_*")
    proc = exported.export(
        log_root,
        str(export_dir),
        "--litert=int8",
        f"--train_data_path={missing}",
    )
    assert proc.returncode == 2
    errors = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1, proc.stderr
    assert "--litert=int8 calibrates on the run's training images" in errors[0]
    assert missing in errors[0]
    assert "Traceback" not in proc.stderr
    assert not export_dir.exists()

"""python -m tf_resnet.predict: an exported model classifies files.

The run is the shared `exported_run` (conftest.py): 40 steps on the
synthetic data, with flip TTA and dataset normalisation, exported.
"""

import csv
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests import exported
from tests.data_files import write_cifar_records
from tests.exported import TrainingModel
from tests.helpers import ROOT, load_data_script


@pytest.fixture(scope="module")
def export_dir(exported_run):
    return exported_run[1]


def log_root_of(export_dir):
    return os.path.join(os.path.dirname(export_dir), "run")


def predict(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "tf_resnet.predict", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


def read_csv(path):
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


def test_record_file_top1_is_the_eval_steps_argmax(
    export_dir, synthetic_cifar, tmp_path
):
    output = tmp_path / "preds.csv"
    proc = predict(
        f"--model_dir={export_dir}",
        f"--output={output}",
        synthetic_cifar["eval"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_csv(output)
    _, labels = exported.read_cifar10_records(synthetic_cifar["eval"])
    assert [int(r["record"]) for r in rows] == list(range(len(labels)))
    assert [int(r["label"]) for r in rows] == labels.tolist()
    top1 = np.array([int(r["class_1"]) for r in rows])
    expected = exported.eval_argmax(
        log_root_of(export_dir), synthetic_cifar["eval"]
    )
    np.testing.assert_array_equal(top1, expected)
    assert len(set(top1.tolist())) >= 3  # The model tells images apart.

    lines = proc.stdout.splitlines()
    assert len(lines) == len(labels)
    with open(os.path.join(export_dir, "labels.txt")) as f:
        names = f.read().splitlines()
    first = rows[0]
    assert lines[0].startswith(
        f"{synthetic_cifar['eval']}[0] (label {names[labels[0]]}): "
        f"{first['name_1']} "
    )
    assert lines[0].count(" | ") == 4  # Top-5.


def write_generated_images(folder):
    """Synthetic-dataset images as files of several kinds and sizes."""
    images, _ = load_data_script("make_synthetic_cifar").make_images(6, 11)
    files = []
    for index, (kind, size) in enumerate(
        [
            ("rgb.png", (32, 32)),
            ("large.png", (80, 56)),
            ("small.jpg", (24, 24)),
            ("gray.png", (32, 32)),
            ("rgba.png", (48, 48)),
            ("palette.png", (32, 40)),
        ]
    ):
        image = Image.fromarray(images[index]).resize(size, Image.BILINEAR)
        if kind == "gray.png":
            image = image.convert("L")
        elif kind == "rgba.png":
            image = image.convert("RGBA")
            image.putalpha(200)
        elif kind == "palette.png":
            image = image.convert("P")
        path = os.path.join(folder, kind)
        image.save(path)
        files.append(path)
    return files


def test_image_files_get_the_training_models_top5(export_dir, tmp_path):
    files = write_generated_images(str(tmp_path))
    output = tmp_path / "preds.csv"
    proc = predict(f"--model_dir={export_dir}", f"--output={output}", *files)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_csv(output)
    assert [r["file"] for r in rows] == files
    reference = TrainingModel(log_root_of(export_dir))
    top1 = []
    for path, row in zip(files, rows, strict=True):
        assert row["record"] == "" and row["label"] == ""
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"))[None]
        expected = reference.probabilities(pixels)[0]
        classes = [int(row[f"class_{k}"]) for k in range(1, 6)]
        assert classes == np.argsort(-expected)[:5].tolist(), path
        np.testing.assert_allclose(
            [float(row[f"probability_{k}"]) for k in range(1, 6)],
            expected[classes],
            rtol=0,
            atol=1e-5,
        )
        top1.append(classes[0])
    assert len(set(top1)) >= 2
    assert len(proc.stdout.splitlines()) == len(files)


def test_bad_files_get_one_error_line_each_and_the_rest_is_classified(
    export_dir, synthetic_cifar, tmp_path
):
    good = write_generated_images(str(tmp_path))[:2]
    truncated = tmp_path / "truncated.png"
    with open(good[0], "rb") as stream:
        truncated.write_bytes(stream.read()[:200])
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    cifar100 = tmp_path / "train.bin"
    write_cifar_records(str(cifar100), "cifar100", 5)
    missing = tmp_path / "missing.jpg"
    bad = {
        str(truncated): "unreadable image",
        str(text): "not a JPEG/PNG image, nor a file of 3073-byte CIFAR",
        str(cifar100): "3073-byte CIFAR records (15370 bytes)",
        str(missing): "no such file",
        str(tmp_path): "is a directory",
    }
    output = tmp_path / "preds.csv"
    args = [good[0], *bad, good[1]]
    proc = predict(f"--model_dir={export_dir}", f"--output={output}", *args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(errors) == len(bad), proc.stderr
    for line, (path, message) in zip(errors, bad.items(), strict=True):
        assert line.startswith(f"predict: error: {path}: "), line
        assert message in line, line
    assert [r["file"] for r in read_csv(output)] == good
    assert len(proc.stdout.splitlines()) == len(good)


def test_a_folder_that_is_no_export_is_refused(tmp_path):
    image = write_generated_images(str(tmp_path))[0]
    proc = predict(f"--model_dir={tmp_path}", image)
    assert proc.returncode == 2
    errors = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1 and "not a readable export" in errors[0]
    assert str(tmp_path) in errors[0]


def test_a_training_folder_gets_the_command_that_exports_it(
    exported_run, tmp_path
):
    """The error names the export command; run as given, predict then works."""
    log_root = str(tmp_path / "my run")  # A space: the command quotes it.
    shutil.copytree(exported_run[0], log_root)
    image = write_generated_images(str(tmp_path))[0]
    proc = predict(f"--model_dir={log_root}", image)
    assert proc.returncode == 2
    # Its one line (newer TensorFlow prints notices of its own around it).
    (error,) = [
        line
        for line in proc.stderr.strip().splitlines()
        if line.startswith("predict: ")
    ]
    assert error.startswith(f"predict: error: --model_dir={log_root} is a "
                            "training run's --log_root"), error  # fmt: skip
    command = re.search(r"export it first: (.*), then give", error)
    assert command, error
    argv = shlex.split(command.group(1))
    # The interpreter that runs (a bare `python` may lack TensorFlow).
    assert argv[1] == "resnet_main.py", argv
    assert os.path.samefile(os.path.join(ROOT, argv[0]), sys.executable)
    export = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, cwd=ROOT
    )  # fmt: skip
    assert export.returncode == 0, export.stderr[-2000:]
    export_dir = f"{log_root}_export"
    assert error.endswith(f"then give --model_dir={shlex.quote(export_dir)}")
    proc = predict(f"--model_dir={export_dir}", image)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.splitlines()) == 1


def test_predict_imports_nothing_else_of_tf_resnet():
    code = (
        "import sys, tf_resnet.predict; "
        "print(sorted(m for m in sys.modules if m.startswith('tf_resnet')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[0] == "['tf_resnet', 'tf_resnet.predict']"

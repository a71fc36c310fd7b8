r"""Classifies image files with an exported model (`--mode=export`).

  python -m tf_resnet.predict --model_dir=/tmp/resnet_export cat.jpg dog.png
  python -m tf_resnet.predict --model_dir=/tmp/resnet_export \
      --output=preds.csv cifar-10-batches-bin/test_batch.bin
  python -m tf_resnet.predict --model_dir=/tmp/resnet_export \
      --format=litert cat.jpg                     # model.tflite (--litert)

Each file is a JPEG or PNG image (or BMP, GIF, WebP) of any size, grayscale,
palette and RGBA images converted to RGB; or a file of CIFAR binary records
of the exported model's dataset (3073-byte CIFAR-10 or 3074-byte CIFAR-100
records: `export.json` tells which), each record one image. For every image
the top-5 classes are printed with their names and probabilities, and
`--output` writes them as CSV. A file that cannot be read (missing, not an
image, truncated) gets one error line naming it; the other files are still
classified, and the exit code is then 2.

Only the export directory is read: the SavedModel, whose graph holds the
preprocessing, `labels.txt` and `export.json`. Nothing of tf-resnet's
training code is imported, so this runs wherever TensorFlow and Pillow do.
For the same reason a training run's `--log_root` given as `--model_dir`
is not exported here (that builds the model with the training code and
writes a folder): the error gives the `--mode=export` command to run.

`--format=litert` classifies with `model.tflite` instead (`--mode=export
--litert=float|int8`), through the `ai-edge-litert` package's interpreter
where it is installed, else TensorFlow's deprecated `tf.lite.Interpreter`
(said once on stderr). Its input has the dataset's stored size, so an image
of another size is resized to it (bilinear, rounded to uint8) before it is
given to the model; the SavedModel normalises first, then resizes, so such
images can get slightly other probabilities than with the SavedModel.
"""

import argparse
import csv
import dataclasses
import json
import os
import shlex
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image, ImageOps, UnidentifiedImageError  # noqa: E402

TOP_K = 5
# Formats told apart by their signature bytes; ones PIL guesses from weak
# headers (TGA) could take a record file for an image.
IMAGE_FORMATS = ("JPEG", "PNG", "BMP", "GIF", "WEBP")
RECORDS_PER_CALL = 256


class UnreadableFile(Exception):
    """A file given to classify cannot be read; the message says why."""


@dataclasses.dataclass
class Images:
    """The images of one file: `pixels` uint8 `[N, H, W, 3]`.

    `labels` are the true classes of record files, `None` for image files.
    """

    path: str
    pixels: np.ndarray
    labels: np.ndarray | None = None


def in_batches(classify, pixels, batch=RECORDS_PER_CALL):
    """`classify`'s probabilities of `pixels`, `batch` images per call."""
    return np.concatenate(
        [
            classify(pixels[start : start + batch])
            for start in range(0, len(pixels), batch)
        ]
    )


def training_run_advice(model_dir):
    """What to run first when `model_dir` is a training run, not an export.

    A training run's `--log_root` holds `config.json` and checkpoints but
    no `export.json`; the user meant its model, so the answer is the
    export command with their folder in it. None for any other folder.
    """
    found = [
        name
        for name in ("config.json", "checkpoint")
        if os.path.isfile(os.path.join(model_dir, name))
    ]
    if not found or os.path.exists(os.path.join(model_dir, "export.json")):
        return None
    export_dir = os.path.normpath(model_dir) + "_export"
    return (
        f"--model_dir={model_dir} is a training run's --log_root "
        f"({' and '.join(found)}), not an export; export it first: "
        f"{shlex.quote(_interpreter())} resnet_main.py --mode=export "
        f"--log_root={shlex.quote(model_dir)} "
        f"--export_dir={shlex.quote(export_dir)}, then give "
        f"--model_dir={shlex.quote(export_dir)}"
    )


def _interpreter():
    """This Python as a command (`.venv/bin/python`), as `detect` says it.

    A bare `python` may be one without TensorFlow. Kept here, as this
    module imports nothing else of tf-resnet.
    """
    relative = os.path.relpath(sys.executable)
    return sys.executable if relative.startswith("..") else relative


def _export_facts(model_dir):
    """`(export.json's facts, the class names of labels.txt)` of an export."""
    with open(os.path.join(model_dir, "export.json"), encoding="utf-8") as f:
        info = json.load(f)
    with open(os.path.join(model_dir, "labels.txt"), encoding="utf-8") as f:
        return info, [line.rstrip("\n") for line in f]


class ExportedModel:
    """The SavedModel, class names and facts of an export directory."""

    def __init__(self, model_dir):
        self.info, self.class_names = _export_facts(model_dir)
        loaded = tf.saved_model.load(model_dir)
        self.serve = loaded.signatures[
            self.info.get("signature", "serving_default")
        ]

    def probabilities(self, pixels):
        """Class probabilities `[N, classes]` of uint8 images `[N, H, W, 3]`."""
        return in_batches(
            lambda chunk: self.serve(images=tf.constant(chunk))[
                "probabilities"
            ].numpy(),
            pixels,
        )


def litert_interpreter():
    """`(Interpreter class, its package)`: ai-edge-litert's, else TF's."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return tf.lite.Interpreter, "tf.lite"
    return Interpreter, "ai_edge_litert"


class LiteRTModel:
    """`model.tflite`, class names and facts of an export directory.

    The same interface as `ExportedModel`.
    """

    def __init__(self, model_dir):
        self.info, self.class_names = _export_facts(model_dir)
        facts = self.info.get("litert")
        if not facts:
            raise ValueError(
                "export.json lists no model.tflite; export with --litert=float "
                "or --litert=int8"
            )
        path = os.path.join(model_dir, facts["file"])
        interpreter_class, package = litert_interpreter()
        if package != "ai_edge_litert":
            print(
                "predict: ai-edge-litert is not installed; using "
                "tf.lite.Interpreter",
                file=sys.stderr,
            )
        try:
            interpreter = interpreter_class(model_path=path)
            self.runner = interpreter.get_signature_runner(
                self.info.get("signature", "serving_default")
            )
        except (RuntimeError, ValueError) as error:
            raise ValueError(
                f"{path}: not a readable LiteRT model "
                f"({str(error).strip().splitlines()[0]})"
            ) from error
        self.size = facts["input"]["shape"][1]

    def probabilities(self, pixels):
        """Class probabilities `[N, classes]` of uint8 images `[N, H, W, 3]`."""
        if pixels.shape[1:3] != (self.size, self.size):
            resized = tf.image.resize(pixels, [self.size, self.size])
            pixels = tf.cast(tf.round(resized), tf.uint8).numpy()
        return in_batches(
            lambda chunk: self.runner(images=chunk)["probabilities"], pixels
        )


def read_image(path):
    """An image file as uint8 `[1, H, W, 3]` RGB, upright by its EXIF tag.

    Raises:
      UnidentifiedImageError: not an image of `IMAGE_FORMATS`.
      UnreadableFile: an image that cannot be decoded (e.g. truncated).
    """
    try:
        with Image.open(path, formats=IMAGE_FORMATS) as image:
            image = ImageOps.exif_transpose(image)
            pixels = np.asarray(image.convert("RGB"))
    except UnidentifiedImageError:
        raise
    except (OSError, SyntaxError, ValueError) as error:
        raise UnreadableFile(f"unreadable image ({error})") from error
    return pixels[None]


def read_records(path, layout, num_classes):
    """A file of CIFAR binary records as images `[N, S, S, 3]` and labels.

    `layout` is `export.json`'s `cifar_record`: where the label sits in a
    record of `record_bytes` bytes, followed by the R, G and B planes.

    Raises:
      UnreadableFile: the file is not a whole number of records, or holds
        a label outside the model's classes.
    """
    size = os.path.getsize(path)
    record_bytes = layout["record_bytes"]
    if size == 0 or size % record_bytes:
        raise UnreadableFile(
            f"not a JPEG/PNG image, nor a file of {record_bytes}-byte CIFAR "
            f"records ({size} bytes)"
        )
    records = np.fromfile(path, np.uint8).reshape(-1, record_bytes)
    labels = records[:, layout["label_offset"]]
    bad = np.flatnonzero(labels >= num_classes)
    if bad.size:
        raise UnreadableFile(
            f"not a JPEG/PNG image, nor CIFAR records: record {bad[0]} has "
            f"label {labels[bad[0]]}, outside the model's {num_classes} "
            "classes"
        )
    side = layout["image_size"]
    planes = records[:, layout["label_bytes"] :].reshape(-1, 3, side, side)
    return planes.transpose(0, 2, 3, 1), labels


def read_file(path, info):
    """The images of one file given on the command line.

    Raises:
      UnreadableFile: missing, a folder, not an image nor records of the
        model's dataset, or damaged.
    """
    if not os.path.exists(path):
        raise UnreadableFile("no such file")
    if os.path.isdir(path):
        raise UnreadableFile("is a directory, expected an image file")
    try:
        return Images(path, read_image(path))
    except UnidentifiedImageError:
        pass
    layout = info.get("cifar_record")
    if layout is None:
        raise UnreadableFile(
            "not a JPEG/PNG image (record files are read for CIFAR models "
            f"only, this one is for {info.get('dataset')})"
        )
    try:
        pixels, labels = read_records(path, layout, info["num_classes"])
    except OSError as error:
        raise UnreadableFile(
            f"unreadable ({error.strerror or error})"
        ) from error
    return Images(path, pixels, labels)


def top_classes(probabilities, k=TOP_K):
    """`[N, k]` class indices, most probable first."""
    k = min(k, probabilities.shape[-1])
    return np.argsort(-probabilities, axis=-1, kind="stable")[:, :k]


def rows_of(images, probabilities, class_names):
    """One result dict per image: its name, true label, top classes."""
    rows = []
    for index, top in enumerate(top_classes(probabilities)):
        is_record = images.labels is not None
        rows.append(
            {
                "file": images.path,
                "record": index if is_record else "",
                "label": int(images.labels[index]) if is_record else "",
                "top": [
                    (int(c), class_names[c], float(probabilities[index, c]))
                    for c in top
                ],
            }
        )
    return rows


def format_row(row, class_names):
    """The printed line of one image."""
    name = row["file"]
    if row["record"] != "":
        name += f"[{row['record']}] (label {class_names[row['label']]})"
    classes = " | ".join(f"{n} {100 * p:.1f}%" for _, n, p in row["top"])
    return f"{name}: {classes}"


def write_csv(path, rows):
    """`file, record, label` then `class_i, name_i, probability_i` columns."""
    k = max((len(row["top"]) for row in rows), default=TOP_K)
    header = ["file", "record", "label"]
    for rank in range(1, k + 1):
        header += [f"class_{rank}", f"name_{rank}", f"probability_{rank}"]
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(header)
        for row in rows:
            cells = [row["file"], row["record"], row["label"]]
            for c, n, p in row["top"]:
                cells += [c, n, f"{p:.6f}"]
            writer.writerow(cells)


FORMATS = {"saved_model": ExportedModel, "litert": LiteRTModel}


def parse_args(argv):
    """The command line: `--model_dir`, `--output` and the files."""
    parser = argparse.ArgumentParser(
        prog="python -m tf_resnet.predict",
        description="Top-5 classes of images, with an exported model.",
    )
    parser.add_argument(
        "--model_dir",
        required=True,
        help="the --export_dir of resnet_main.py --mode=export",
    )
    parser.add_argument(
        "--output", help="also write the predictions to this CSV file"
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="saved_model",
        help="the SavedModel, or model.tflite of --mode=export --litert",
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="JPEG/PNG images, or CIFAR binary record files",
    )
    return parser.parse_args(argv)


def main(argv=None):
    """Classifies the files; returns the exit code (2 if any was bad)."""
    args = parse_args(argv)
    advice = training_run_advice(args.model_dir)
    if advice:
        print(f"predict: error: {advice}", file=sys.stderr)
        return 2
    try:
        model = FORMATS[args.format](args.model_dir)
    except (OSError, ValueError, KeyError) as error:
        print(
            f"predict: error: --model_dir={args.model_dir}: not a readable "
            f"export ({str(error).strip().splitlines()[0]})",
            file=sys.stderr,
        )
        return 2
    rows, failed = [], False
    for path in args.files:
        try:
            images = read_file(path, model.info)
        except UnreadableFile as error:
            print(f"predict: error: {path}: {error}", file=sys.stderr)
            failed = True
            continue
        probabilities = model.probabilities(images.pixels)
        for row in rows_of(images, probabilities, model.class_names):
            print(format_row(row, model.class_names))
            rows.append(row)
    if args.output:
        write_csv(args.output, rows)
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`--mode=export --litert=float|int8`: the export as a LiteRT flatbuffer.

LiteRT (formerly TensorFlow Lite) is what phones, single-board computers
and edge boxes run. `model.tflite` is written next to the SavedModel from
the same serving function, so it holds the same preprocessing and TTA:

* input `images`: raw uint8 RGB `[N, S, S, 3]`, S the dataset's stored
  size (32 for CIFAR, 64 for TinyImageNet), N any batch;
* outputs `probabilities` (float32 `[N, classes]`, dequantised in the
  int8 model) and `classes` (int64 `[N]`).

`float` keeps float32 weights and arithmetic. `int8` is fully integer:
weights and activations are int8, calibrated on a few hundred images of the
run's training split (every k-th in file order, read by the project's own
reader), and the uint8 input is taken as it is (scale 1, zero point 0).
The converter, asked for int8 kernels only, still leaves an op it cannot
quantise in float32 without a word, so the converted model is checked and
such ops are an error that names them: a fully-integer model is what int8
targets (microcontrollers, NPUs) can run at all. TensorFlow 2.18's
converter has no int8 SQRT and DIV, which the per-image standardisation
(`--normalization=per_image`) needs; 2.21's has.

The converter reads a SavedModel (`TFLiteConverter.from_saved_model`;
`from_keras_model` fails on Keras 3 models), written for it to a temporary
folder with the input shape fixed.
"""

import os
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tf_resnet import data
from tf_resnet.data import DATASETS, pipeline
from tf_resnet.errors import DataError, UserInputError
from tf_resnet.predict import in_batches, litert_interpreter

LITERT_FILE = "model.tflite"
# "A few hundred" images: the post-training quantisation guide's advice.
CALIBRATION_IMAGES = 300
_SIGNATURE = "serving_default"
# (De)quantising at the edges, and the nodes of a delegate (XNNPACK), whose
# ops are listed on their own too.
_NOT_COMPUTING = ("QUANTIZE", "DEQUANTIZE", "DELEGATE")
_EVAL_BATCH = 100


def input_size(config):
    """Side of the images `model.tflite` takes: the dataset's stored one."""
    return DATASETS[config.data.dataset].image_size


def read_split(config, training, count=None):
    """Raw uint8 images `[N, S, S, 3]` and labels of one of the run's splits.

    Read through the run's own reader (`data.split_of`), without
    normalisation or augmentation. With `count`, every k-th example in file
    order, k spreading `count` over the split (a CIFAR file or a
    TinyImageNet folder is ordered by class in places).

    Raises:
      DataError: the split's files are missing or unreadable (the message
        names them).
    """
    split = data.split_of(config, training=training)
    stride = 1 if count is None else max(1, split.num_examples // count)
    dataset = pipeline.make_pipeline(
        split.table(),
        split.num_examples,
        lambda batch, seed: split.decode_batch(batch),
        training=False,
        batch_size=256,
        options=data.InputOptions(num_shards=stride),
        element_fn=split.decode_element,
    )
    batches = list(dataset.as_numpy_iterator())
    images = np.concatenate([images for images, _ in batches])[:count]
    labels = np.concatenate([labels for _, labels in batches])[:count]
    return images.astype(np.uint8), labels, split.path


def calibration_images(config):
    """The int8 calibration set: `(images, path)`.

    Raises:
      DataError: no training data to calibrate on.
    """
    path = config.data.split_path(True)
    if not path:
        raise DataError(
            "--litert=int8 calibrates on the run's training images: its "
            "config.json names no training data; give --train_data_path"
        )
    try:
        images, _, path = read_split(config, True, CALIBRATION_IMAGES)
    except DataError as error:
        raise DataError(
            f"--litert=int8 calibrates on the run's training images, which "
            f"cannot be read ({error}); --train_data_path=PATH gives others"
        ) from error
    return images, path


def convert(model, serve, size, kind, calibration=None, normalization=None):
    """The `.tflite` flatbuffer of `serve` around `model`.

    Args:
      model: the Keras model `serve` calls (tracked for its weights).
      serve: `fn(images [N, S, S, 3], 0-255) -> {probabilities, classes}`.
      size: S.
      kind: `float` or `int8`.
      calibration: uint8 images `[K, S, S, 3]` (`int8` only).
      normalization: the run's `--normalization`, for the error's hint.

    Raises:
      UserInputError: the converter fails, or (int8) ops are left in float.
    """
    if kind == "int8":
        # The fake quantisation pins the input's range to 0-255 whatever
        # the calibration images span, so raw pixels are the uint8 input.
        def endpoint(images):
            pinned = tf.quantization.fake_quant_with_min_max_args(
                images, 0.0, 255.0, num_bits=8
            )
            return serve(pinned)

        spec = tf.TensorSpec([None, size, size, 3], tf.float32, name="images")
    else:
        endpoint = serve
        spec = tf.TensorSpec([None, size, size, 3], tf.uint8, name="images")
    folder = tempfile.mkdtemp(prefix="litert-")
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint(_SIGNATURE, endpoint, input_signature=[spec])
        archive.write_out(folder, verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(
            folder, signature_keys=[_SIGNATURE]
        )
        if kind == "int8":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.target_spec.supported_ops = [
                tf.lite.OpsSet.TFLITE_BUILTINS_INT8
            ]
            converter.inference_input_type = tf.uint8
            converter.representative_dataset = lambda: (
                {"images": calibration[i : i + 1].astype(np.float32)}
                for i in range(len(calibration))
            )
        try:
            flatbuffer = converter.convert()
        except Exception as error:  # The converter's errors have no base.
            problem = str(error).strip().splitlines()[0][:300]
            raise UserInputError(
                f"--litert={kind}: the LiteRT converter failed ({problem})"
            ) from error
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if kind == "int8":
        _check_fully_integer(flatbuffer, normalization)
    return flatbuffer


def float_ops(flatbuffer):
    """Names of the ops computing in float32, other than (de)quantising."""
    interpreter_class, _ = litert_interpreter()
    interpreter = interpreter_class(model_content=flatbuffer)
    dtypes = {t["index"]: t["dtype"] for t in interpreter.get_tensor_details()}
    names = []
    # The op list has no public accessor; this one exists since TF 2.5.
    for op in interpreter._get_ops_details():
        if op["op_name"] in _NOT_COMPUTING:
            continue
        tensors = [*op["inputs"], *op["outputs"]]
        if any(dtypes.get(t) == np.float32 for t in tensors if t >= 0):
            names.append(op["op_name"])
    return names


def _check_fully_integer(flatbuffer, normalization):
    names = float_ops(flatbuffer)
    if not names:
        return
    hint = "export --litert=float"
    if normalization == "per_image":
        hint = (
            "this TensorFlow's converter has no int8 SQRT and DIV for the "
            "per-image standardisation of --normalization=per_image, and "
            "what follows them stays in float too: train with "
            "--normalization=dataset (as --recipe=fast does), or " + hint
        )
    raise UserInputError(
        f"--litert=int8: {', '.join(dict.fromkeys(names))} would run in "
        f"float32 (no int8 kernel), so the model would not be fully "
        f"integer; {hint}"
    )


def probabilities(flatbuffer, images):
    """The `.tflite`'s probabilities of uint8 images, in batches."""
    interpreter_class, _ = litert_interpreter()
    runner = interpreter_class(model_content=flatbuffer).get_signature_runner(
        _SIGNATURE
    )
    return in_batches(
        lambda chunk: runner(images=chunk)["probabilities"], images, _EVAL_BATCH
    )


def evaluate(flatbuffer, saved_model_dir, images, labels):
    """Top-1/top-5 of the `.tflite` and the SavedModel on the same images.

    Returns:
      A dict for `export.json`: `images`, `saved_model` and `litert` (each
      `{top1, top5}`), and `top1_agreement` (fraction of images whose top
      class is the same in both).
    """
    serve = tf.saved_model.load(saved_model_dir).signatures[_SIGNATURE]
    reference = in_batches(
        lambda chunk: serve(images=tf.constant(chunk))["probabilities"].numpy(),
        images,
        _EVAL_BATCH,
    )
    converted = probabilities(flatbuffer, images)

    def accuracy(probs):
        top5 = np.argsort(-probs, axis=-1, kind="stable")[:, :5]
        return {
            "top1": float(np.mean(top5[:, 0] == labels)),
            "top5": float(np.mean((top5 == labels[:, None]).any(axis=-1))),
        }

    agreement = np.mean(reference.argmax(-1) == converted.argmax(-1))
    return {
        "images": len(images),
        "saved_model": accuracy(reference),
        "litert": accuracy(converted),
        "top1_agreement": float(agreement),
    }


def report(kind, evaluation, path):
    """The evaluation as the lines `--mode=export` prints."""
    name = f"LiteRT {kind}"
    rows = [("SavedModel", evaluation["saved_model"])]
    rows.append((name, evaluation["litert"]))
    lines = [
        f"{name} against the SavedModel on {evaluation['images']} images "
        f"of {path}:",
        f"{'':<12}  {'top-1':>6}  {'top-5':>6}",
    ]
    for label, result in rows:
        lines.append(
            f"{label:<12}  {100 * result['top1']:5.1f}%  "
            f"{100 * result['top5']:5.1f}%"
        )
    lines.append(f"top-1 agreement: {100 * evaluation['top1_agreement']:.1f}%")
    return "\n".join(lines)


def write(folder, kind, flatbuffer, size, calibration=None):
    """Writes `model.tflite` to `folder`; its facts for `export.json`.

    `calibration` is `(images, path)` of an int8 model's calibration set.
    """
    path = os.path.join(folder, LITERT_FILE)
    with open(path, "wb") as stream:
        stream.write(flatbuffer)
    logging.info("wrote %s (%d bytes, %s)", LITERT_FILE, len(flatbuffer), kind)
    return {
        "file": LITERT_FILE,
        "format": kind,
        "bytes": len(flatbuffer),
        "input": {
            "name": "images",
            "dtype": "uint8",
            "shape": [-1, size, size, 3],
        },
        "calibration": None
        if calibration is None
        else {"path": calibration[1], "images": len(calibration[0])},
    }

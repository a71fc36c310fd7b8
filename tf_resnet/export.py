"""`--mode=export`: a trained run as files people can use without tf-resnet.

`export(config, export_dir)` restores a checkpoint of the run in
`config.run.log_root` (its moving average when the run kept one) and
writes to `export_dir`:

* a TensorFlow SavedModel (`saved_model.pb`, `variables/`) whose
  `serving_default` signature takes raw RGB images, `images: uint8
  [N, H, W, 3]` of any H and W, and returns `probabilities` (float32
  `[N, classes]`) and `classes` (int64 `[N]`, the top-1 index). The
  input preprocessing of evaluation and the run's test-time augmentation
  are inside the graph, so `tf.saved_model.load(export_dir)` is all a user
  needs: no Python code of this package, no preprocessing to re-implement;
* `model.keras`: the same network for Keras (normalised float32 images at
  the run's input size in, logits out); loading it needs `tf_resnet.models`
  imported, whose layers it is made of;
* `labels.txt`: one class name per line, in class-index order (the names
  the training data carried, else the indices);
* `export.json`: what was exported (model, dataset, step, test accuracy,
  input size, normalisation, TTA, EMA) and the CIFAR record layout
  `tf_resnet.predict` reads record files with;
* with `--litert=float|int8`, `model.tflite`: the same graph for LiteRT
  (`tf_resnet.litert`), evaluated beside the SavedModel on the run's
  evaluation split, its facts under `litert` in `export.json`.

Preprocessing order. The graph applies the evaluation pipeline's own
`preprocessing.finish_batch`: uint8 -> float32, normalise, then resize to
the model's input size. An image of the stored size of the dataset (32x32
for CIFAR) therefore gets exactly the evaluation input, also when the run
trained at another `--image_size`. Another size is treated as if it were
stored at that size: per-image standardisation uses that image's own mean
and deviation, while dataset normalisation, affine per channel, gives the
same result before or after the bilinear resize. Resizing an image to its
own size is exact, so nothing changes for images of the input size.

The model is built in float32 whatever `--dtype` the run trained with
(float64 checkpoints are converted), so the exported graph runs on any CPU.
"""

import dataclasses
import json
import os
import re
import shutil
import tempfile
import types

import keras
import tensorflow as tf
from absl import logging

from tf_resnet import litert, summaries
from tf_resnet.builders import build_model, make_ema
from tf_resnet.checkpointing import unreadable
from tf_resnet.config import layers as config_lib
from tf_resnet.data import DATASETS, cifar_binary, preprocessing
from tf_resnet.distribute.base import Distributor, TrainState
from tf_resnet.errors import StorageError, UserInputError
from tf_resnet.tta import tta_logits

SIGNATURE = "serving_default"
KERAS_FILE = "model.keras"
LABELS_FILE = "labels.txt"
EXPORT_JSON = "export.json"
_CHECKPOINT_NAME = re.compile(r"ckpt-(\d+)")


def export(config, export_dir, checkpoint=None):
    """Writes the run's model to `export_dir` (see the module docstring).

    The directory is written next to its final place and renamed into it,
    so a failed export leaves no half-written model; an earlier export in
    `export_dir` is replaced.

    Args:
      config: the run's `settings.Config` (as resolved from its saved
        `config.json` and the flags).
      export_dir: the directory to write; new, empty, or an earlier export.
      checkpoint: path of the checkpoint to export (e.g. `LOG/ckpt-2000`);
        `None` or empty: the latest in `config.run.log_root`.

    Returns:
      The `export.json` document, as a dict.

    Raises:
      UserInputError: no or an unreadable checkpoint, one of another model,
        or an `export_dir` holding other files; with `--litert`, data that
        cannot be read, or an int8 model that is not fully integer.
      StorageError: `export_dir` cannot be written.
    """
    log_root = config.run.log_root
    path = checkpoint_path(log_root, checkpoint)
    _check_export_dir(export_dir)
    litert_inputs = _litert_inputs(config)
    info = model_info(config)
    model = restore_float32(config, info, path)
    step = checkpoint_step(path)
    metadata = _metadata(config, info, path, step)
    try:
        _write_atomically(
            export_dir,
            lambda folder: _write_files(
                folder, model, config, info, metadata, litert_inputs
            ),
        )
    except OSError as error:
        raise StorageError(
            f"--export_dir={export_dir}: cannot write the export "
            f"({error.strerror or error})"
        ) from error
    logging.info(
        "exported %s (step %s, test accuracy %s) to %s",
        path,
        step,
        metadata["test_accuracy"],
        export_dir,
    )
    return metadata


def checkpoint_path(log_root, checkpoint=None):
    """The checkpoint to export: `checkpoint` if given, else the latest.

    Raises:
      UserInputError: there is none, or it cannot be read.
    """
    if not checkpoint:
        latest = tf.train.latest_checkpoint(log_root)
        if latest is None:
            raise UserInputError(
                f"--log_root={log_root}: no checkpoint to export"
            )
        return latest
    path = checkpoint.removesuffix(".index")
    problem = unreadable(path)
    if problem:
        raise UserInputError(
            f"--checkpoint={checkpoint}: not a readable checkpoint ({problem})"
        )
    return path


def checkpoint_step(path):
    """The training step of a checkpoint named `ckpt-STEP`, else `None`."""
    match = _CHECKPOINT_NAME.fullmatch(os.path.basename(path))
    return int(match.group(1)) if match else None


def model_info(config):
    """Classes, input size and class names of the run's model.

    From the plan the training run saved with its config; without one
    (a checkpoint from elsewhere), from the dataset's facts. The input size
    is the one `builders.build_model` builds the model at.
    """
    plan = config_lib.read_plan(config.run.log_root)
    if plan is None:
        facts = DATASETS[config.data.dataset]
        plan = {
            "num_classes": facts.num_classes,
            "image_size": facts.image_size,
        }
    return types.SimpleNamespace(
        num_classes=plan["num_classes"],
        image_size=config.data.image_size or plan["image_size"],
        class_names=plan.get("class_names"),
    )


def restore_float32(config, info, path):
    """The model of `config` with the weights (or EMA) of checkpoint `path`.

    Built under the float32 dtype policy, whatever the process's policy is
    (which is left as it was). A float64 checkpoint is restored into a
    float64 model first and its values cast.

    Raises:
      UserInputError: the checkpoint holds another model, or no moving
        average although the run's config has `ema_decay`.
    """
    float64 = _holds_float64(path)
    previous = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy("float64" if float64 else "float32")
        model = _restore(config, info, path)
        if float64:
            keras.config.set_dtype_policy("float32")
            weights = model.get_weights()
            model = _build(config, info)
            model.set_weights(weights)
    finally:
        keras.config.set_dtype_policy(previous)
    return model


def _holds_float64(path):
    dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
    return any(
        name.startswith("model/") and dtype == tf.float64
        for name, dtype in dtypes.items()
    )


def _build(config, info):
    """The run's architecture, randomly initialised (weights come later).

    A torchvision `--pretrained` file only initialised the run, so it is not
    read again; Keras' own ResNet50 (`imagenet`, `.h5`) is another
    architecture and is built from its file as in training.
    """
    pretrained = config.model.pretrained
    if pretrained != "imagenet" and not pretrained.endswith(".h5"):
        pretrained = ""
    model_config = dataclasses.replace(config.model, pretrained=pretrained)
    config = dataclasses.replace(config, model=model_config)
    return build_model(config, Distributor(config.optim), info)


def _restore(config, info, path):
    distributor = Distributor(config.optim)
    model = _build(config, info)
    ema = make_ema(config, distributor, model)
    state = TrainState(model, ema=ema)
    checkpoint = tf.train.Checkpoint(**state.checkpoint_objects())
    status = checkpoint.restore(path).expect_partial()  # No optimizer here.
    try:
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        problem = str(error).strip().splitlines()[0][:300]
        raise UserInputError(
            f"{path}: checkpoint does not match the run's model "
            f"{config.model.model} ({problem}); export with the flags the "
            "checkpoint was trained with"
        ) from error
    if ema is not None:
        ema.copy_to(model)
    return model


def _normalization(config):
    """`(mean, std)` on the 0-255 scale, or `(None, None)` per image."""
    if config.data.normalization != "dataset":
        return None, None
    facts = DATASETS[config.data.dataset]
    return (
        tuple(255.0 * value for value in facts.mean),
        tuple(255.0 * value for value in facts.std),
    )


def serving_function(model, config, image_size):
    """`fn(images uint8 [N, H, W, 3]) -> {probabilities, classes}`.

    The evaluation input pipeline's preprocessing (`finish_batch`, without
    augmentation) and the run's test-time augmentation around the model.
    """
    mean, std = _normalization(config)
    tta = config.optim.eval_tta

    def serve(images):
        no_labels = tf.zeros(tf.shape(images)[:1], tf.int32)
        inputs, _ = preprocessing.finish_batch(
            images,
            no_labels,
            None,
            pad=0,
            image_size=image_size,
            mean=mean,
            std=std,
        )
        logits = tf.cast(tta_logits(model, inputs, tta), tf.float32)
        probabilities = tf.nn.softmax(logits)
        return {
            "probabilities": probabilities,
            "classes": tf.argmax(probabilities, axis=-1),
        }

    return serve


def _metadata(config, info, path, step):
    rows = summaries.read_eval_csv(
        os.path.join(config.run.log_root, summaries.EVAL_CSV)
    )
    row = rows.get(step) if step is not None else None
    mean, std = _normalization(config)
    record = cifar_binary.FORMATS.get(config.data.dataset)
    return {
        "model": config.model.model,
        "dataset": config.data.dataset,
        "step": step,
        "checkpoint": os.path.abspath(path),
        "test_accuracy": float(row["precision"]) if row else None,
        "num_classes": info.num_classes,
        "image_size": info.image_size,
        "normalization": config.data.normalization,
        "mean": mean,
        "std": std,
        "eval_tta": config.optim.eval_tta,
        "ema": bool(config.optim.ema_decay),
        "signature": SIGNATURE,
        "cifar_record": None
        if record is None
        else {
            "label_offset": record.label_offset,
            "label_bytes": record.label_bytes,
            "record_bytes": record.record_bytes,
            "image_size": DATASETS[record.name].image_size,
        },
    }


def _litert_inputs(config):
    """What `--litert` reads before anything is written: its data.

    The int8 model's calibration images, and the images of the run's
    evaluation split the `.tflite` is evaluated on beside the SavedModel
    (`None` when the run names no evaluation data).
    """
    kind = config.run.litert
    if not kind:
        return None
    calibration = litert.calibration_images(config) if kind == "int8" else None
    evaluation = None
    if config.data.split_path(False):
        evaluation = litert.read_split(config, False)
    else:
        logging.info("no --eval_data_path: the .tflite is not evaluated")
    return types.SimpleNamespace(
        kind=kind, calibration=calibration, evaluation=evaluation
    )


def _write_files(folder, model, config, info, metadata, litert_inputs=None):
    archive = keras.export.ExportArchive()
    archive.track(model)
    serve = serving_function(model, config, info.image_size)
    archive.add_endpoint(
        SIGNATURE,
        serve,
        input_signature=[
            tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")
        ],
    )
    archive.write_out(folder, verbose=False)
    if litert_inputs is not None:
        metadata["litert"] = _write_litert(
            folder, model, serve, config, litert_inputs
        )
    model.save(os.path.join(folder, KERAS_FILE))
    names = info.class_names or [str(i) for i in range(info.num_classes)]
    with open(os.path.join(folder, LABELS_FILE), "w", encoding="utf-8") as f:
        f.writelines(f"{name}\n" for name in names)
    with open(os.path.join(folder, EXPORT_JSON), "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=2)
        f.write("\n")


def _write_litert(folder, model, serve, config, inputs):
    """Converts, writes, evaluates `model.tflite`; its `export.json` facts."""
    size = litert.input_size(config)
    images = None if inputs.calibration is None else inputs.calibration[0]
    flatbuffer = litert.convert(
        model, serve, size, inputs.kind, images, config.data.normalization
    )
    facts = litert.write(
        folder, inputs.kind, flatbuffer, size, inputs.calibration
    )
    facts["evaluation"] = None
    if inputs.evaluation is not None:
        images, labels, path = inputs.evaluation
        facts["evaluation"] = litert.evaluate(
            flatbuffer, folder, images, labels
        )
        facts["evaluation"]["path"] = path
        print(litert.report(inputs.kind, facts["evaluation"], path), flush=True)
    return facts


def _check_export_dir(export_dir):
    """Refuses a file, or a folder of other files, as `--export_dir`."""
    if not os.path.exists(export_dir):
        return
    if not os.path.isdir(export_dir):
        raise UserInputError(f"--export_dir={export_dir}: is a file")
    contents = os.listdir(export_dir)
    if contents and EXPORT_JSON not in contents:
        raise UserInputError(
            f"--export_dir={export_dir}: holds other files (no "
            f"{EXPORT_JSON} of an earlier export); give a new or empty "
            "directory"
        )


def _write_atomically(export_dir, write_fn):
    """Runs `write_fn(folder)` on a new folder, then moves it to `export_dir`.

    The folder is a sibling of `export_dir`, so the move is a rename; an
    earlier export is replaced only once the new one is complete.
    """
    export_dir = os.path.abspath(export_dir)
    parent = os.path.dirname(export_dir)
    os.makedirs(parent, exist_ok=True)
    folder = tempfile.mkdtemp(
        dir=parent, prefix=f".{os.path.basename(export_dir)}.tmp-"
    )
    try:
        write_fn(folder)
        os.chmod(folder, 0o755)
        if os.path.exists(export_dir):
            replaced = folder + "-replaced"
            os.rename(export_dir, replaced)
            os.rename(folder, export_dir)
            shutil.rmtree(replaced)
        else:
            os.rename(folder, export_dir)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise

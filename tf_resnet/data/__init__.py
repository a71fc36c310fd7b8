"""Datasets behind one function, `open_split`, and one table, `DATASETS`.

`open_split(dataset, path, training=...)` lists and checks the files of one
split once and returns a `Split`: its facts (`num_examples`,
`num_classes`, `image_size`, `class_names`) and `split.dataset(batch_size,
InputOptions(...))`, the `tf.data` pipeline of `(images float32
[B, H, W, 3], labels int32 [B])` batches. Each on-disk format has its own
reader module (as in tensorflow/models official/r1), one `Split` subclass
each.
"""

import os

from tf_resnet.config.datasets import (
    DATASETS,
    SOURCES,
    DatasetFacts,
    InputOptions,
)
from tf_resnet.data import cifar_binary, cifar_pickle, tfds_source, tinyimagenet
from tf_resnet.data.split import Split
from tf_resnet.errors import DataError, UserInputError

__all__ = [
    "input_options",
    "split_of",
    "DATASETS",
    "DatasetFacts",
    "InputOptions",
    "Split",
    "infer_source",
    "open_split",
]

READERS = {
    "binary": cifar_binary.BinarySplit,
    "pickle": cifar_pickle.PickleSplit,
    "tfds": tfds_source.TfdsSplit,
    "folder": tinyimagenet.FolderSplit,
}
# The formats are the dataset table's (`SOURCES`, `--data_source`'s
# choices): a reader each, checked here, so the two cannot drift apart.
if set(READERS) != set(SOURCES):
    raise ImportError(
        f"readers {sorted(READERS)} are not the datasets' sources "
        f"{sorted(SOURCES)} (tf_resnet.config.datasets)"
    )
_FILE_READERS = ("binary", "pickle")


def _facts(dataset):
    try:
        return DATASETS[dataset]
    except KeyError:
        raise UserInputError(
            f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}"
        ) from None


def infer_source(dataset, path):
    """The on-disk format of a split when none was asked for.

    A dataset with one source (TinyImageNet: `folder`) is read from it.
    CIFAR files are told apart by their first byte: the python pickles start
    with the pickle PROTO opcode, the binaries with a label byte. TFDS is
    never inferred: a TFDS data dir is a folder like any other.

    Returns:
      `(source, files)`: `files` is the sorted list of CIFAR files already
      matched (so they are not listed again), or `None`.

    Raises:
      DataError: no file matches `path`, or it names a folder.
    """
    facts = _facts(dataset)
    if len(facts.sources) == 1:
        return facts.sources[0], None
    files = cifar_binary.list_files(path)
    first = files[0]
    if os.path.isdir(first):
        raise DataError(
            f"{first}: is a folder; pass a glob of the {dataset} files in it "
            f"(e.g. {os.path.join(first, 'data_batch_*')}), or "
            "--data_source=tfds if it is a TFDS data dir"
        )
    source = "pickle" if cifar_binary.starts_like_pickle(first) else "binary"
    return source, files


def open_split(dataset, path, *, training, source=None):
    """Lists and checks the files of one split; the `Split` that reads them.

    Args:
      dataset: a key of `DATASETS`.
      path: glob of the CIFAR files (comma-separated globs allowed), the
        Tiny-ImageNet root folder, or the TFDS data dir (empty: TFDS's
        default).
      training: the training split (TinyImageNet `train/`, TFDS `train`)
        or the evaluation split (`val/`, `test`); also how its batches are
        made (see `Split.dataset`).
      source: `binary`, `pickle`, `tfds` or `folder`; `None` or empty:
        inferred (see `infer_source`).

    Returns:
      The opened `Split`.

    Raises:
      UserInputError: unknown dataset, or a source it cannot be read from.
      DataError: the files are missing, empty or in the wrong format (the
        message names the file).
    """
    facts = _facts(dataset)
    files = None
    if not source:
        source, files = infer_source(dataset, path)
    if source not in facts.sources:
        raise UserInputError(
            f"--dataset={dataset} cannot be read from --data_source={source}; "
            f"its sources: {', '.join(facts.sources)} (or leave "
            "--data_source unset to infer it)"
        )
    reader = READERS[source]
    if source in _FILE_READERS:
        return reader(dataset, path, training, files=files)
    return reader(dataset, path, training)


def split_of(config, training):
    """The training or evaluation split of a run's `settings.Config`."""
    return open_split(
        config.data.dataset,
        config.data.split_path(training),
        training=training,
        source=config.data.data_source,
    )


def input_options(config, **options):
    """`InputOptions` of a run's `settings.Config`, plus per-pipeline `options`.

    The run's data settings are the knobs of every pipeline
    (`settings.DataConfig` is an `InputKnobs`), for training and evaluation
    alike.
    """
    return InputOptions(**{**config.data.knobs(), **options})

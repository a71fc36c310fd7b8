"""Dataset sources behind one function, `build_dataset`.

Each source lives in its own module (as in tensorflow/models official/r1)
and returns batches of `(images float32 [B, H, W, 3], labels int32 [B])`.
"""

import dataclasses

from tf_resnet.data import cifar_binary, cifar_pickle, tfds_source, tinyimagenet
from tf_resnet.errors import UserInputError


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What the model and the training loop need to know about a dataset."""

    num_classes: int
    image_size: int


DATASETS = {
    "cifar10": DatasetInfo(num_classes=10, image_size=32),
    "cifar100": DatasetInfo(num_classes=100, image_size=32),
    # The class count is read from train/ (see tinyimagenet.info).
    "tinyimagenet": DatasetInfo(num_classes=200, image_size=64),
}

_SOURCES = {
    ("cifar10", "binary"): cifar_binary,
    ("cifar100", "binary"): cifar_binary,
    ("cifar10", "pickle"): cifar_pickle,
    ("cifar100", "pickle"): cifar_pickle,
    ("cifar10", "tfds"): tfds_source,
    ("cifar100", "tfds"): tfds_source,
    ("tinyimagenet", "folder"): tinyimagenet,
}


def _source(dataset, source):
    try:
        return _SOURCES[(dataset, source)]
    except KeyError:
        known = ", ".join(f"{d}/{s}" for d, s in sorted(_SOURCES))
        raise UserInputError(
            f"no reader for --dataset={dataset} --data_source={source}; "
            f"known: {known}"
        ) from None


def build_dataset(
    dataset, file_pattern, training, batch_size, source="binary", **options
):
    """Builds the input pipeline of one dataset.

    Args:
      dataset: `cifar10`, `cifar100` (more come with more sources).
      file_pattern: glob of the data files (comma-separated globs allowed),
        or the dataset root folder for folder-based sources.
      training: `True`: shuffled, repeated forever, augmented (pad, random
        crop, flip), standardised. `False`: every record exactly once, in
        file order, standardised only.
      batch_size: examples per batch of this pipeline.
      source: on-disk format (`binary` for the official CIFAR binaries).
      **options: `seed`, `start_step`, `num_shards`, `shard_index`,
        `shuffle_buffer`, `cache`, `image_size`, `pad`.

    Returns:
      `tf.data.Dataset` of `(images float32 [B,H,W,3], labels int32 [B])`.

    Raises:
      DataError: the files are missing, empty or in the wrong format.
    """
    return _source(dataset, source).build(
        dataset, file_pattern, training, batch_size, **options
    )


def dataset_info(dataset, file_pattern, source="binary"):
    """Class count and native image size of a dataset.

    Sources whose class count comes from the data (TinyImageNet folders)
    define `info(dataset, file_pattern)`; the others use `DATASETS`.
    """
    module = _source(dataset, source)
    if hasattr(module, "info"):
        return module.info(dataset, file_pattern)
    return DATASETS[dataset]


def num_examples(dataset, file_pattern, source="binary"):
    """How many examples the files of one split hold (validating them)."""
    return _source(dataset, source).num_examples(dataset, file_pattern)

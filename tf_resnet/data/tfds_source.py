"""Reader for CIFAR-10 / CIFAR-100 as prepared by tensorflow-datasets.

`--data_source=tfds` reads the `cifar10` / `cifar100` TFDS datasets that
were prepared beforehand (`tfds build cifar10 --data_dir=DIR` on a machine
with internet). The data path is that TFDS data dir (empty: TFDS's default,
`~/tensorflow_datasets`). Nothing is ever downloaded: a dataset that is not
prepared is a `DataError` saying how to prepare it.

Splits: `train` for training, `test` for evaluation. CIFAR-100's `label` is
the fine label (TFDS names the coarse one `coarse_label`). Records are read
one file after the other (`interleave_cycle_length=1`), so evaluation sees
them in the order they are stored. The decoded uint8 images are cached in
memory (150 MB for CIFAR-10) like the binary reader's records, so PNG
decoding happens once.

`tensorflow_datasets` is imported only when this source is used: it is slow
to import and other sources do not need it.
"""

import tensorflow as tf

from tf_resnet.data import pipeline
from tf_resnet.errors import DataError

SPLITS = {True: "train", False: "test"}
IMAGE_SIZE = 32


def _builder(dataset, data_dir):
    import tensorflow_datasets as tfds  # Slow; only for this source.

    return tfds.builder(dataset, data_dir=data_dir or None)


def _not_prepared(dataset, data_dir, detail):
    where = data_dir or "the default TFDS data dir (~/tensorflow_datasets)"
    return DataError(
        f"{where}: TFDS dataset {dataset} is not prepared there ({detail}); "
        f"prepare it once with `tfds build {dataset} --data_dir=DIR` where "
        "there is internet (this reader never downloads), then pass that DIR"
    )


def load_split(dataset, data_dir, training):
    """`tf.data.Dataset` of `{"image", "label"}` in stored order."""
    import tensorflow_datasets as tfds  # Slow; only for this source.

    builder = _builder(dataset, data_dir)
    read_config = tfds.ReadConfig(
        interleave_cycle_length=1, try_autocache=False
    )
    try:
        examples = builder.as_dataset(
            split=SPLITS[training],
            shuffle_files=False,
            as_supervised=True,
            read_config=read_config,
        )
    except (AssertionError, KeyError, ValueError) as error:
        raise _not_prepared(dataset, data_dir, error) from error
    return examples.map(
        lambda image, label: {
            "image": image,
            "label": tf.cast(label, tf.int32),
        }
    )


def build(dataset, data_dir, training, batch_size, **options):
    """`tf.data.Dataset` of a prepared TFDS split; see `data.build_dataset`."""
    elements = load_split(dataset, data_dir, training)
    options.setdefault("cache", True)
    return pipeline.make_image_pipeline(
        elements,
        native_size=IMAGE_SIZE,
        training=training,
        batch_size=batch_size,
        **options,
    )


def num_examples(dataset, data_dir):
    """Examples of the prepared training split."""
    splits = _builder(dataset, data_dir).info.splits
    try:
        return splits[SPLITS[True]].num_examples
    except KeyError as error:
        raise _not_prepared(dataset, data_dir, error) from error

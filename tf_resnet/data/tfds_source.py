"""Reader for CIFAR-10 / CIFAR-100 as prepared by tensorflow-datasets.

`--data_source=tfds` reads the `cifar10` / `cifar100` TFDS datasets that
were prepared beforehand (`tfds build cifar10 --data_dir=DIR` on a machine
with internet). The data path is that TFDS data dir (empty: TFDS's default,
`~/tensorflow_datasets`). Nothing is ever downloaded: a dataset that is not
prepared is a `DataError` saying how to prepare it.

Splits: `train` for training, `test` for evaluation. CIFAR-100's `label` is
the fine label (TFDS names the coarse one `coarse_label`). Records are read
one file after the other (`interleave_cycle_length=1`), so evaluation sees
them in the order they are stored. Each pipeline decodes the split once
into its table (150 MB of uint8 images for CIFAR-10), like the binary
reader's records, so PNG decoding happens once.

This source is never inferred: `--data_source=tfds` must be asked for.
`tensorflow_datasets` is imported only when it is: it is slow to import
and other sources do not need it.
"""

import tensorflow as tf

from tf_resnet.data.split import Split
from tf_resnet.errors import DataError

SPLITS = {True: "train", False: "test"}


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


def load_split(builder, data_dir, training):
    """`tf.data.Dataset` of `{"image", "label"}` in stored order.

    Raises:
      DataError: the split is not prepared in `data_dir`.
    """
    import tensorflow_datasets as tfds  # Slow; only for this source.

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
        raise _not_prepared(builder.name, data_dir, error) from error
    return examples.map(
        lambda image, label: {
            "image": image,
            "label": tf.cast(label, tf.int32),
        }
    )


class TfdsSplit(Split):
    """A split of a prepared TFDS dataset; its count and names come from it.

    Its table is the decoded uint8 images, read whole when a pipeline
    starts, like the binary reader's records.
    """

    source = "tfds"

    def __init__(self, dataset_name, data_dir, training):
        self.builder = _builder(dataset_name, data_dir)
        # Reading the split is what fails when it is not prepared; TFDS
        # records its size, so the count reads no example.
        count = int(load_split(self.builder, data_dir, training).cardinality())
        if count < 0:
            raise _not_prepared(
                dataset_name, data_dir, "the split's size is unknown"
            )
        super().__init__(
            dataset_name,
            data_dir,
            training,
            num_examples=count,
            class_names=list(self.builder.info.features["label"].names),
        )

    def table(self):
        examples = load_split(self.builder, self.path, self.training)
        return examples.batch(self.num_examples)

"""The reader interface: a `Split` is opened once and makes `tf.data` inputs.

Opening a split lists and checks its files (each reader says what it
checks), so bad data fails before training starts, once per process. The
split then keeps what it found and builds any number of input pipelines
from it (one per shard, or again when a run resumes) without listing the
file system again. Each pipeline reads the split's *table* (its examples,
undecoded, indexed in file order) and gathers examples from it by index,
which is what lets every training epoch be a permutation of the whole
split (`pipeline.training_order`).
"""

import abc

from tf_resnet.config.datasets import DATASETS, InputOptions
from tf_resnet.data import augment, pipeline, preprocessing

DEFAULT_OPTIONS = InputOptions()


class Split(abc.ABC):
    """One split of one dataset in one on-disk format, listed and checked.

    Attributes:
      dataset_name: key of `DATASETS` (`cifar10`, ...).
      source: the on-disk format (`binary`, `pickle`, `tfds`, `folder`).
      path: the data path the split was opened from.
      training: the training split (shuffled, repeated, augmented batches)
        or the evaluation split (every example once, in file order).
      num_examples: examples in the split.
      num_classes: classes of the labels (for TinyImageNet: the class
        folders found, which a sample may have fewer of than 200).
      image_size: side length of the stored images.
      class_names: label index -> name, when the files carry names.
    """

    source = ""
    # `fn(element) -> element` run on each element before batching, for
    # readers whose elements need per-example work (JPEG decoding); the
    # others batch raw elements, as decoding whole batches is cheaper.
    decode_element = None

    def __init__(
        self,
        dataset_name,
        path,
        training,
        *,
        num_examples,
        class_names=None,
        num_classes=None,
    ):
        self.dataset_name = dataset_name
        self.facts = DATASETS[dataset_name]
        self.path = path
        self.training = training
        self.num_examples = num_examples
        self.num_classes = num_classes or self.facts.num_classes
        self.image_size = self.facts.image_size
        self.class_names = class_names

    def __repr__(self):
        kind = "training" if self.training else "evaluation"
        return (
            f"<{type(self).__name__} {self.dataset_name} {kind} split of "
            f"{self.path!r}: {self.num_examples} examples, "
            f"{self.num_classes} classes>"
        )

    @abc.abstractmethod
    def table(self):
        """The whole split, undecoded, as one element of a `tf.data.Dataset`.

        A dict of tensors whose first dimension indexes the examples in
        file order: the pipeline gathers examples from it by index. Built
        by tf.data when the pipeline starts, on the host that runs it.
        """

    def decode_batch(self, batch):
        """A batch of elements -> `(images [B, H, W, 3], labels [B])`."""
        return batch["image"], batch["label"]

    def dataset(self, batch_size, options=DEFAULT_OPTIONS):
        """The input pipeline of this split.

        Training: each epoch a permutation of the whole split, repeated
        forever, augmented (pad, random crop, flip); evaluation: every
        example exactly once, in file order, with a final partial batch.
        Both are normalised and resized to `options.image_size` when it
        differs from the stored size.

        Args:
          batch_size: examples per batch of this pipeline.
          options: `InputOptions`.

        Returns:
          `tf.data.Dataset` of `(images float32 [B, H, W, 3],
          labels int32 [B])`.
        """
        pad = self.facts.pad if options.pad is None else options.pad
        image_size = options.image_size
        if image_size == self.image_size:
            image_size = None
        mean = std = None
        if options.normalization == "dataset":  # On the 0-255 pixel scale.
            mean = tuple(255.0 * value for value in self.facts.mean)
            std = tuple(255.0 * value for value in self.facts.std)

        def batch_fn(batch, seed):
            images, labels = self.decode_batch(batch)
            images, labels = preprocessing.finish_batch(
                images,
                labels,
                seed,
                pad=pad,
                image_size=image_size,
                mean=mean,
                std=std,
            )
            if seed is None:
                return images, labels
            return augment.batch_regularisation(
                images, labels, seed, self.num_classes, options
            )

        return pipeline.make_pipeline(
            self.table(),
            self.num_examples,
            batch_fn,
            training=self.training,
            batch_size=batch_size,
            options=options,
            element_fn=self.decode_element,
        )

"""What is known of each dataset, and the data settings of a run.

`DATASETS` is the one table of dataset facts: the readers', the config's,
the benches', `data/download.py`'s (the published archives) and the batch
jobs' (where a split's files are once downloaded); `SOURCES`, the on-disk
formats `--data_source` offers, is derived from it, and `tf_resnet.data`
checks its readers against it.
`InputKnobs` are the options every input pipeline reads: each field is
declared once, with `schema.setting`, and is at the same time the run's
setting (`DataConfig` extends `InputKnobs`), so its flag, and the option
the pipeline reads. A new input knob is a field here plus the code that
reads it. `InputOptions` adds what each pipeline is given by its caller:
the seed, where a resumed run starts, its shard. `DataConfig` is the data
group of the settings: these knobs, which dataset and where its files are.

Outside `tf_resnet.data`, whose package imports TensorFlow, so that the
config offers and checks the dataset names and declares the knobs without
it.
"""

import dataclasses

from tf_resnet.config.schema import NON_NEGATIVE, setting
from tf_resnet.errors import UserInputError


@dataclasses.dataclass(frozen=True)
class Archive:
    """One published archive of a dataset and what it unpacks to.

    Attributes:
      url: the official address; a mirror must serve the same bytes.
      md5: its checksum, as published.
      folder: the top-level folder it unpacks to.
      train: the training files in `folder` (a glob), "" for the folder
        itself (a TinyImageNet root is both splits).
      eval: the evaluation files in `folder`, likewise.
    """

    url: str
    md5: str
    folder: str
    train: str = ""
    eval: str = ""

    @property
    def filename(self):
        """Name on disk: the official one, whatever mirror serves it."""
        return self.url.rsplit("/", 1)[-1]

    def split_path(self, root, training):
        """The path of a split once unpacked under the data root `root`."""
        files = self.train if training else self.eval
        return "/".join(x for x in (root, self.folder, files) if x)


@dataclasses.dataclass(frozen=True)
class DatasetFacts:
    """What is known about a dataset before any of its files is read.

    Attributes:
      num_classes: classes of the full dataset. A TinyImageNet folder may
        hold fewer (a sample); its split counts its own class folders.
      image_size: side length of the stored images.
      pad: default zero padding of the training crop. CIFAR's 4 of 32 is
        the original recipe; TinyImageNet's 8 of 64 is the same relative
        shift (12.5%), so the augmentation is as strong as on CIFAR.
      sources: the on-disk formats the dataset can be read from; the first
        is inferred when the dataset has only one.
      mean: per-channel (R, G, B) mean of the training images on the 0-1
        scale, as published; `normalization="dataset"` scales it to the
        0-255 pixel values.
      std: per-channel standard deviation, same scale as `mean`.
      archives: the published archives by `data/download.py --format`;
        the first is what it fetches by default, and where the batch jobs
        look.
      eval_split: what the dataset calls the split a run evaluates on, as
        the learning curve names it (TinyImageNet's labelled one is `val`).
    """

    num_classes: int
    image_size: int
    pad: int
    sources: tuple[str, ...]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    archives: dict[str, Archive]
    eval_split: str = "test"


def _cifar(num_classes, mean, std, archives):
    """CIFAR-10 and -100 differ in classes, pixel statistics, archives."""
    return DatasetFacts(
        num_classes=num_classes,
        image_size=32,
        pad=4,
        sources=("binary", "pickle", "tfds"),
        mean=mean,
        std=std,
        archives=archives,
    )


_TORONTO = "https://www.cs.toronto.edu/~kriz/"
# The mean and std are the pixel statistics of each training set (50,000
# CIFAR images, 100,000 TinyImageNet images) that torchvision-based recipes
# use with `transforms.Normalize`. The archives' md5 values are as
# published on https://www.cs.toronto.edu/~kriz/cifar.html and used by
# torchvision.
DATASETS = {
    "cifar10": _cifar(
        10,
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
        {
            "binary": Archive(
                _TORONTO + "cifar-10-binary.tar.gz",
                "c32a1d4ab5d03f1284b67883e8d87530",
                "cifar-10-batches-bin",
                train="data_batch_*.bin",
                eval="test_batch.bin",
            ),
            "python": Archive(
                _TORONTO + "cifar-10-python.tar.gz",
                "c58f30108f718f92721af3b95e74349a",
                "cifar-10-batches-py",
                train="data_batch_*",
                eval="test_batch",
            ),
        },
    ),
    "cifar100": _cifar(
        100,
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        {
            "binary": Archive(
                _TORONTO + "cifar-100-binary.tar.gz",
                "03b5dce01913d631647c71ecec9e9cb8",
                "cifar-100-binary",
                train="train.bin",
                eval="test.bin",
            ),
            "python": Archive(
                _TORONTO + "cifar-100-python.tar.gz",
                "eb9058c3a382ffc7106e4002c42a8d85",
                "cifar-100-python",
                train="train",
                eval="test",
            ),
        },
    ),
    "tinyimagenet": DatasetFacts(
        num_classes=200,
        image_size=64,
        pad=8,
        sources=("folder",),
        mean=(0.4802, 0.4481, 0.3975),
        std=(0.2302, 0.2265, 0.2262),
        archives={
            "jpeg": Archive(
                "http://cs231n.stanford.edu/tiny-imagenet-200.zip",
                "90528d7ca1a48142e341f4ef8d21d0de",
                "tiny-imagenet-200",
            ),
        },
        eval_split="val",
    ),
}
# Every on-disk format some dataset is read from, in the table's order:
# `--data_source`'s choices and the keys of `tf_resnet.data.READERS`.
SOURCES = tuple(
    dict.fromkeys(
        source for facts in DATASETS.values() for source in facts.sources
    )
)

NORMALIZATIONS = ("per_image", "dataset")


@dataclasses.dataclass(frozen=True)
class InputKnobs:
    """The input settings of a run, as every pipeline of the run reads them.

    Attributes:
      shuffle: training: each epoch a new permutation of the whole split
        (`pipeline.training_order`); `False` reads it in file order, for
        checks that need to know which example comes when.
      image_size: side of the output images; `None` keeps the dataset's.
      normalization: `per_image` standardises each image on its own (the
        original example); `dataset` subtracts the dataset's per-channel
        mean and divides by its std (`DatasetFacts.mean`/`std`).
      cutout_size: training: side of a square zeroed at a random place of
        each image (0: off).
      mixup_alpha: training: mixup of each batch with Beta(a, a) weights
        (0: off); labels become `[B, classes]` float targets.
      cutmix_alpha: training: CutMix likewise (with mixup: one of the two
        per batch).
    """

    shuffle: bool = setting(
        True,
        "Each training epoch a new permutation of the whole training split; "
        "--noshuffle reads it in file order (for checks).",
    )
    image_size: int | None = setting(
        None,
        "Side of the model input; images are resized when it differs from "
        "the dataset's (e.g. 224 for ImageNet weights).",
    )
    normalization: str = setting(
        "per_image",
        "per_image standardisation, or the dataset's per-channel mean/std.",
        choices=NORMALIZATIONS,
    )
    cutout_size: int = setting(
        0, "Cutout square side; 0: off.", bounds=NON_NEGATIVE
    )
    mixup_alpha: float = setting(
        0.0, "Mixup Beta(alpha, alpha); 0: off.", bounds=NON_NEGATIVE
    )
    cutmix_alpha: float = setting(
        0.0, "CutMix Beta(alpha, alpha); 0: off.", bounds=NON_NEGATIVE
    )

    def knobs(self):
        """`{name: value}` of the knobs alone (not of a subclass' fields)."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(InputKnobs)
        }


@dataclasses.dataclass(frozen=True)
class InputOptions(InputKnobs):
    """How one input pipeline reads a split: the knobs and its own place.

    Attributes:
      seed: seed of the training order and of the augmentation.
      start_step: training batches to skip (the step a run resumes at).
      num_shards: input pipelines reading disjoint shards (Horovod ranks,
        workers or tf.distribute input pipelines).
      shard_index: which shard this pipeline reads.
      pad: zero padding of the training crop; `None`: the dataset's.
    """

    seed: int = 0
    start_step: int = 0
    num_shards: int = 1
    shard_index: int = 0
    pad: int | None = None

    def __post_init__(self):
        if self.normalization not in NORMALIZATIONS:
            raise UserInputError(
                f"normalization={self.normalization!r}: expected one of "
                f"{', '.join(NORMALIZATIONS)}"
            )
        if not 0 <= self.shard_index < self.num_shards:
            raise UserInputError(
                f"shard_index={self.shard_index} is not in "
                f"[0, num_shards={self.num_shards})"
            )


@dataclasses.dataclass(frozen=True)
class DataConfig(InputKnobs):
    """Which dataset, where its files are, and how they are read.

    The knobs of every input pipeline (`--normalization`, `--cutout_size`,
    ...) are the inherited fields of `InputKnobs`: one declaration is the
    flag, the setting and what the pipeline reads.
    """

    dataset: str = setting(
        "cifar10",
        "Dataset.",
        choices=tuple(sorted(DATASETS)),
    )
    data_source: str | None = setting(
        None,
        "On-disk format; default: inferred (folder for tinyimagenet; binary "
        "or pickle from the CIFAR files' first bytes). binary (official CIFAR "
        "binaries), pickle (official CIFAR python pickles: data_batch_*, "
        "test_batch; cifar-100-python/train, test), tfds (CIFAR prepared by "
        "tensorflow-datasets in --tfds_data_dir; never downloads, never "
        "inferred), folder (--dataset=tinyimagenet: tiny-imagenet-200 root "
        "as both data paths).",
        choices=SOURCES,
    )
    train_data_path: str = setting(
        "",
        "Glob of training files, e.g. datasets/cifar-100-binary/train.bin "
        "or 'datasets/cifar-10-batches-bin/data_batch*' (where "
        "data/download.py puts them); TinyImageNet: its folder, "
        "datasets/tiny-imagenet-200.",
    )
    eval_data_path: str = setting(
        "",
        "Glob of evaluation files, e.g. datasets/cifar-100-binary/test.bin "
        "or datasets/cifar-10-batches-bin/test_batch.bin; TinyImageNet: "
        "its folder, as --train_data_path.",
    )
    tfds_data_dir: str = setting(
        "",
        "--data_source=tfds: TFDS data dir of the prepared dataset (empty: "
        "~/tensorflow_datasets), for both splits.",
    )

    def split_path(self, training):
        """The path a split is read from (TFDS reads one data dir)."""
        if self.data_source == "tfds":
            return self.tfds_data_dir
        return self.train_data_path if training else self.eval_data_path

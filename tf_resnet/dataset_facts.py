"""The one table of dataset facts: the readers', the config's, the benches'.

Outside `tf_resnet.data`, whose package imports TensorFlow, so that the
config offers and checks the dataset names without it.
"""

import dataclasses


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
      eval_split: what the dataset calls the split a run evaluates on, as
        the learning curve names it (TinyImageNet's labelled one is `val`).
    """

    num_classes: int
    image_size: int
    pad: int
    sources: tuple[str, ...]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    eval_split: str = "test"


def _cifar(num_classes, mean, std):
    """CIFAR-10 and CIFAR-100 differ only in classes and pixel statistics."""
    return DatasetFacts(
        num_classes=num_classes,
        image_size=32,
        pad=4,
        sources=("binary", "pickle", "tfds"),
        mean=mean,
        std=std,
    )


# The mean and std are the pixel statistics of each training set (50,000
# CIFAR images, 100,000 TinyImageNet images) that torchvision-based recipes
# use with `transforms.Normalize`.
DATASETS = {
    "cifar10": _cifar(10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": _cifar(100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "tinyimagenet": DatasetFacts(
        num_classes=200,
        image_size=64,
        pad=8,
        sources=("folder",),
        mean=(0.4802, 0.4481, 0.3975),
        std=(0.2302, 0.2265, 0.2262),
        eval_split="val",
    ),
}

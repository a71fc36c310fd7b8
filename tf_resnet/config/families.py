"""Every model by name, its family, the options a family takes: the model group.

Each option (`--shortcut`, `--stem`, ...) is one field of `ModelOptions`,
declared with `schema.setting`. The same field is the option the builder
(`models.resnet`) or the blocks read, the run's setting (`ModelConfig`,
the model group of the settings, extends `ModelOptions`) and so its flag: a new
option is a field here plus the code that reads it. A `Family` says which
options its models take and its own defaults, so a family whose
architecture has no use for an option refuses it with one clear error
instead of ignoring it.

`VARIANTS` names every model and its family: `models.MODELS` is built from
it, and the config checks an option against the model's family before
anything is built. Outside `tf_resnet.models`, whose package imports
TensorFlow, so that the config reads it without TensorFlow.
"""

import dataclasses
import os
import sys

from tf_resnet import detect
from tf_resnet.config import schema
from tf_resnet.config.schema import BELOW_ONE, setting
from tf_resnet.errors import UserInputError

SHORTCUTS = ("zero_pad", "projection")
STEMS = ("imagenet", "cifar")
# Options every family takes: they change the blocks, not the layout.
COMMON = frozenset(("shortcut", "sync_bn", "zero_init_residual"))
# 6n+2 layers (the paper's Table 6); each also as a pre-activation _v2.
CIFAR_DEPTHS = (20, 32, 44, 56, 110, 1202)
# torchvision's ResNets by depth: their blocks and the blocks per stage.
IMAGENET_LAYOUTS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
}
IMAGENET_LABEL = "resnet" + "/".join(str(d) for d in IMAGENET_LAYOUTS)


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """What a model is built with, beyond its name and input/output sizes.

    Each field is a setting of the run (the flag of the same name) and a
    keyword option of `models.build_model`. Unset (`None`, `False`), it is
    the model's family's to choose: `Family.resolve` fills it in.

    Attributes:
      shortcut: `"zero_pad"` (option A of the paper, no parameters) or
        `"projection"` (option B, 1x1 conv + BN), where the shape changes.
      sync_bn: synchronise batch statistics across replicas.
      stem: `"imagenet"` (7x7/2 conv and 3x3/2 max pool, for 224x224
        inputs) or `"cifar"` (one 3x3/1 conv, for 32x32 or 64x64 inputs).
      dropout_rate: dropout after the stem, or `None` for no dropout layer
        at all (a family without one).
      zero_init_residual: every block starts as its shortcut (see `blocks`).
    """

    shortcut: str | None = setting(
        None,
        "Shortcut on shape changes (default: the model's own: zero_pad for "
        "CIFAR ResNets).",
        choices=SHORTCUTS,
    )
    sync_bn: bool = setting(
        False, "Synchronise BatchNorm batch statistics across replicas."
    )
    stem: str | None = setting(
        None,
        f"{IMAGENET_LABEL}: 7x7/2 conv + max pool (ImageNet, default) or "
        "3x3/1 conv (small images).",
        choices=STEMS,
    )
    dropout_rate: float | None = setting(
        None, "course_resnet: dropout after the first conv.", bounds=BELOW_ONE
    )
    zero_init_residual: bool = setting(
        False,
        "Initialise the last BatchNorm gamma of each residual block at 0.",
    )

    def given(self):
        """`{name: value}` of the options set, not left to the family."""
        values = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(ModelOptions)
        }
        return {
            name: value
            for name, value in values.items()
            if value is not None and value is not False
        }

    def block_options(self):
        """The keyword options of every residual block (`blocks.stages`)."""
        return {
            "shortcut": self.shortcut,
            "sync_bn": self.sync_bn,
            "zero_init_residual": self.zero_init_residual,
        }


@dataclasses.dataclass(frozen=True)
class Family:
    """Models sharing a layout: the options they take and their defaults.

    Attributes:
      label: the family's models, as error messages name them.
      defaults: the options of a model built without any.
      takes: the names of the options a caller may set.
    """

    label: str
    defaults: ModelOptions
    takes: frozenset = COMMON

    def resolve(self, model, given):
        """The options of `model`: the family's defaults updated by `given`.

        Args:
          model: the model's name, for error messages.
          given: `{option name: value}` set by the caller.

        Returns:
          A `ModelOptions`.

        Raises:
          UserInputError: an option the family does not take, or a bad
            value.
        """
        for name in sorted(given):
            if name not in self.takes:
                takers = [f.label for f in FAMILIES if name in f.takes]
                raise UserInputError(
                    f"--{name} is for {' and '.join(takers)}, not {model}"
                    if takers
                    else f"{name!r} is not an option of any model"
                )
        options = dataclasses.replace(self.defaults, **given)
        schema.check(options)
        return options


CIFAR = Family(
    label=f"resnet{CIFAR_DEPTHS[0]}..resnet{CIFAR_DEPTHS[-1]} and their _v2",
    defaults=ModelOptions(shortcut="zero_pad", stem="cifar"),
)
# The assignment's projection shortcut and its one dropout, after the stem.
COURSE = Family(
    label="course_resnet",
    defaults=ModelOptions(
        shortcut="projection", stem="cifar", dropout_rate=0.2
    ),
    takes=COMMON | {"dropout_rate"},
)
# torchvision's projection shortcuts and stem; the stem fits small images.
IMAGENET = Family(
    label=IMAGENET_LABEL,
    defaults=ModelOptions(shortcut="projection", stem="imagenet"),
    takes=COMMON | {"stem"},
)
FAMILIES = (CIFAR, COURSE, IMAGENET)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One model of a family: what its family's builder is given for it.

    Attributes:
      family: the `Family` the model belongs to.
      depth: its weighted layers, where its family has several depths.
      version: CIFAR ResNets: 1 (post-activation) or 2 (pre-activation).
    """

    family: Family
    depth: int | None = None
    version: int | None = None

    @property
    def arguments(self):
        """The keyword arguments its family's builder takes for it."""
        values = {"depth": self.depth, "version": self.version}
        return {k: v for k, v in values.items() if v is not None}


VARIANTS = {
    **{f"resnet{d}": Variant(CIFAR, d, version=1) for d in CIFAR_DEPTHS},
    **{f"resnet{d}_v2": Variant(CIFAR, d, version=2) for d in CIFAR_DEPTHS},
    "course_resnet": Variant(COURSE),
    **{f"resnet{d}": Variant(IMAGENET, d) for d in IMAGENET_LAYOUTS},
}


@dataclasses.dataclass(frozen=True)
class WeightsFile:
    """One published weights file, how its publisher checks it, what it is.

    `data/download.py --weights=NAME` fetches it; a `--pretrained` run
    that misses it names its address, checksum and that command.
    """

    url: str
    algorithm: str  # A hashlib name.
    digest: str  # The whole hex digest, or its prefix (torchvision).
    label: str

    @property
    def filename(self):
        return self.url.rsplit("/", 1)[-1]


# The checkout's folder `data/download.py` puts torchvision's files in,
# where the batch jobs look (`tf_resnet.jobs`).
WEIGHTS_DIR = "weights"

# The files `--pretrained` reads (tf_resnet/models/pretrained.py):
# torchvision's ResNet-18, checked like torch.hub does by the sha256 prefix
# in its name, and Keras' ResNet50 without its classifier, checked by the
# md5 keras.applications.ResNet50 passes to `get_file`.
WEIGHTS = {
    "resnet18": WeightsFile(
        "https://download.pytorch.org/models/resnet18-f37072fd.pth",
        "sha256",
        "f37072fd",
        "torchvision's ResNet-18 ImageNet weights",
    ),
    "keras_resnet50": WeightsFile(
        "https://storage.googleapis.com/tensorflow/keras-applications/"
        "resnet/resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5",
        "md5",
        "4d473c1dd8becc155b73f8504c6f6626",
        "Keras' ResNet50 ImageNet weights without the classifier",
    ),
}


def missing_weights(path, flag="--pretrained"):
    """The error line of a weights file that is not at `path`.

    For a published file (named as its publisher names it): what it is,
    its address and checksum, the command that fetches it where that
    address is reachable, and where to copy it on this machine.
    """
    where = os.path.abspath(path)
    name = os.path.basename(path)
    known = [(k, w) for k, w in WEIGHTS.items() if w.filename == name]
    if not known:
        return f"{path}: no such file ({flag})"
    key, weights = known[0]
    checksum = (
        f"{weights.algorithm} starting {weights.digest}"
        if weights.algorithm == "sha256"
        else f"{weights.algorithm} {weights.digest}"
    )
    return (
        f"{path}: no such file ({flag}); it is {weights.label}, "
        f"{weights.url} ({checksum}). Where that address is reachable, "
        f"{detect.interpreter()} data/download.py --weights={key} fetches "
        f"and checks it; copy that file to {where}"
    )


def models_of(family):
    """The names of `family`'s models, in the order of `VARIANTS`."""
    return tuple(n for n, v in VARIANTS.items() if v.family is family)


def registered_models():
    """`--model`'s choices: the models `tf_resnet.models` can build.

    Asked when the flags are defined, not when this module is imported: a
    script may register a model of its own first (the tests' small
    models, in `models.MODELS`). Read from the model package where it is
    loaded (a run loads it before defining its flags); the shipped ones,
    `VARIANTS`, where it is not, so asking imports no TensorFlow.
    """
    models = sys.modules.get("tf_resnet.models")
    return tuple(sorted(VARIANTS if models is None else models.MODELS))


@dataclasses.dataclass(frozen=True)
class ModelConfig(ModelOptions):
    """The architecture, where its weights start, and its options.

    The options (`--shortcut`, `--stem`, ...) are the inherited fields of
    `ModelOptions`: one declaration is the flag, the setting and what the
    builder reads. `given()` hands those set to `models.build_model`.
    """

    model: str = setting("resnet20", "Architecture.", choices=registered_models)
    pretrained: str = setting(
        "",
        "Start from ImageNet weights: 'imagenet' (Keras' ResNet50 file in "
        "~/.keras/models/, resnet50 only) or a local torchvision state dict "
        f"(.pth/.npz/.safetensors, {IMAGENET_LABEL}). The classifier is "
        "re-initialised for the dataset's classes.",
    )

"""How one input pipeline reads a split: its options, each knob a setting.

`InputKnobs` are the options a run sets: each field is declared once, with
`schema.setting`, and is at the same time the run's setting
(`settings.DataConfig` extends `InputKnobs`), so its flag, and the option
the pipeline reads. A new input knob is a field here plus the code that
reads it. `InputOptions` adds what each pipeline is given by its caller:
the seed, where a resumed run starts, its shard.

Outside `tf_resnet.data`, whose package imports TensorFlow, so that the
settings declare the knobs without it.
"""

import dataclasses

from tf_resnet.errors import UserInputError
from tf_resnet.schema import NON_NEGATIVE, setting

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

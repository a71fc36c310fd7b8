"""Model registry: `build_model(name, num_classes, input_shape, **options)`.

All models map float32 images to logits (no softmax); the loss is computed
from logits in the training loop. Every model is a variant of one builder
(`resnet.resnet`) and reads its options from one type (`ModelOptions`).
Which models there are, their families and the options each family takes
are the table of `tf_resnet.config.families`; this package builds them.
"""

import functools

from tf_resnet.config import families
from tf_resnet.config.families import ModelOptions
from tf_resnet.errors import UserInputError
from tf_resnet.models import (  # noqa: F401  # Each registers its builder.
    cifar_resnet,
    course_resnet,
    imagenet_resnet,
)
from tf_resnet.models import pretrained as pretrained_weights
from tf_resnet.models.resnet import BUILDERS, HEAD_LAYER

__all__ = [
    "HEAD_LAYER",
    "MODELS",
    "ModelOptions",
    "build_model",
    "register_resnet8",
]

# The builders register themselves (`resnet.builds`); every family of the
# table must have one.
_missing = [f.label for f in families.FAMILIES if f not in BUILDERS]
if _missing:
    raise ImportError(f"no builder for {', '.join(_missing)} (resnet.builds)")


def _factory(variant):
    """`(num_classes, input_shape, **options) -> keras.Model` of `variant`."""
    return functools.partial(BUILDERS[variant.family], **variant.arguments)


MODELS = {name: _factory(v) for name, v in families.VARIANTS.items()}


def register_resnet8():
    """Adds `resnet8`, the smallest CIFAR ResNet, to `MODELS`.

    For runs that must take seconds: the multi-process tests' worker and
    `bench/stop_check.py` train it. Not one of `--model`'s choices, which
    are the models a user trains (`families.VARIANTS`): a script calls
    this before it defines the flags, which then take `--model=resnet8`
    (`families.registered_models`).
    """
    MODELS["resnet8"] = _factory(families.Variant(families.CIFAR, 8, version=1))


def build_model(
    name, num_classes, input_shape=(32, 32, 3), pretrained=None, **options
):
    """Builds a registered model.

    Args:
      name: one of `MODELS`: the models of `families.VARIANTS`, and
        any a script has registered since.
      num_classes: size of the classifier.
      input_shape: `(H, W, 3)` of the input images.
      pretrained: `"imagenet"` or a weights file to start from (see
        `tf_resnet.models.pretrained`); `None` for random initialisation.
      **options: fields of `ModelOptions` the model's family takes, e.g.
        `shortcut="projection"`, `sync_bn=True`.

    Returns:
      An unbuilt-optimizer `keras.Model` returning logits.

    Raises:
      UserInputError: an unknown model, an option its family does not take
        or a bad option value.
    """
    try:
        factory = MODELS[name]
    except KeyError:
        raise UserInputError(
            f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}"
        ) from None
    build_fn = functools.partial(
        factory,
        num_classes=num_classes,
        input_shape=tuple(input_shape),
        **options,
    )
    if pretrained:
        return pretrained_weights.build(
            name, pretrained, build_fn, num_classes, tuple(input_shape), options
        )
    return build_fn()

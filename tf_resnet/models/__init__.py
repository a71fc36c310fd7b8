"""Model registry: `build_model(name, num_classes, input_shape, **options)`.

All models map float32 images to logits (no softmax); the loss is computed
from logits in the training loop. Every model is a variant of one builder
(`resnet.resnet`) and reads its options from one type (`ModelOptions`);
each family (`cifar_resnet`, `course_resnet`, `imagenet_resnet`) says which
options it takes.
"""

import functools

from tf_resnet.errors import UserInputError
from tf_resnet.models import cifar_resnet, course_resnet, imagenet_resnet
from tf_resnet.models import pretrained as pretrained_weights
from tf_resnet.models.options import ModelOptions
from tf_resnet.models.resnet import HEAD_LAYER

__all__ = ["HEAD_LAYER", "MODELS", "ModelOptions", "build_model"]

_CIFAR_DEPTHS = (20, 32, 44, 56, 110, 1202)

MODELS = {}
for _depth in _CIFAR_DEPTHS:
    MODELS[f"resnet{_depth}"] = functools.partial(
        cifar_resnet.cifar_resnet, _depth, version=1
    )
    MODELS[f"resnet{_depth}_v2"] = functools.partial(
        cifar_resnet.cifar_resnet, _depth, version=2
    )
MODELS["course_resnet"] = course_resnet.course_resnet
for _depth in imagenet_resnet.LAYOUTS:
    MODELS[f"resnet{_depth}"] = functools.partial(
        imagenet_resnet.imagenet_resnet, _depth
    )


def build_model(
    name, num_classes, input_shape=(32, 32, 3), pretrained=None, **options
):
    """Builds a registered model.

    Args:
      name: one of `MODELS` (`resnet20` ... `resnet1202`, `..._v2`,
        `course_resnet`, `resnet18`, `resnet34`, `resnet50`).
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

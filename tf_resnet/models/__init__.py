"""Model registry: `build_model(name, num_classes, input_shape, **options)`.

All models map float32 images to logits (no softmax); the loss is computed
from logits in the training loop.
"""

import functools

from tf_resnet.errors import UserInputError
from tf_resnet.models import cifar_resnet

_CIFAR_DEPTHS = (20, 32, 44, 56, 110, 1202)

MODELS = {}
for _depth in _CIFAR_DEPTHS:
    MODELS[f"resnet{_depth}"] = functools.partial(
        cifar_resnet.cifar_resnet, _depth, version=1
    )
    MODELS[f"resnet{_depth}_v2"] = functools.partial(
        cifar_resnet.cifar_resnet, _depth, version=2
    )


def build_model(name, num_classes, input_shape=(32, 32, 3), **options):
    """Builds a registered model.

    Args:
      name: one of `MODELS` (`resnet20` ... `resnet1202`, `..._v2`).
      num_classes: size of the classifier.
      input_shape: `(H, W, 3)` of the input images.
      **options: model-specific options, e.g. `shortcut="B"`,
        `sync_bn=True`.

    Returns:
      An unbuilt-optimizer `keras.Model` returning logits.
    """
    try:
        factory = MODELS[name]
    except KeyError:
        raise UserInputError(
            f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}"
        ) from None
    return factory(
        num_classes=num_classes, input_shape=tuple(input_shape), **options
    )

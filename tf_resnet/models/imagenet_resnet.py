"""ResNet-18/34/50 in the layout of torchvision, so its weights import 1:1.

Four stages of 64, 128, 256 and 512 filters ([2, 2, 2, 2] basic blocks for
ResNet-18, [3, 4, 6, 3] for ResNet-34, [3, 4, 6, 3] bottlenecks for
ResNet-50), projection shortcuts, stride 2 at the start of stages 2-4 (on
the 3x3 convolution of a bottleneck, "ResNet v1.5"), global average pooling
and a dense classifier. Trainable parameters for 1000 classes equal
torchvision's: 11,689,512 / 21,797,672 / 25,557,032.

Every strided convolution and the stem's max pool pad symmetrically, as
torch does, so imported weights give torchvision's outputs (Keras 'same'
pads a stride-2 layer on the bottom/right only).

Stems:
  "imagenet": 7x7/2 convolution and 3x3/2 max pool, for 224x224 inputs
    (`--image_size=224` upsamples CIFAR or TinyImageNet images).
  "cifar": a 3x3/1 convolution and no pool, for training 32x32 or 64x64
    images from scratch; ImageNet weights then no longer fit the stem.
"""

import keras
from keras import layers

from tf_resnet.errors import UserInputError
from tf_resnet.models import blocks

LAYOUTS = {
    18: (blocks.BasicBlock, (2, 2, 2, 2)),
    34: (blocks.BasicBlock, (3, 4, 6, 3)),
    50: (blocks.Bottleneck, (3, 4, 6, 3)),
}
STEMS = ("imagenet", "cifar")


def imagenet_resnet(
    depth,
    num_classes,
    input_shape=(224, 224, 3),
    stem="imagenet",
    shortcut="projection",
    sync_bn=False,
    zero_init_residual=False,
    name=None,
):
    """Builds a torchvision-layout ResNet.

    Args:
      depth: 18, 34 or 50.
      num_classes: outputs of the classifier (logits, no softmax).
      input_shape: `(H, W, 3)`.
      stem: `"imagenet"` or `"cifar"` (see the module docstring).
      shortcut: `"projection"` (torchvision) or `"zero_pad"`.
      sync_bn: synchronise batch statistics across replicas.
      zero_init_residual: every block starts as its shortcut (see
        `blocks`; torchvision's option of the same name).
      name: model name; defaults to `resnet{depth}`.

    Returns:
      A `keras.Model` mapping images to logits.
    """
    block, stage_sizes = LAYOUTS[depth]
    if stem not in STEMS:
        raise UserInputError(
            f"--stem must be one of {', '.join(STEMS)}, got {stem!r}"
        )
    inputs = keras.Input(shape=input_shape, name="images")
    if stem == "imagenet":
        x = blocks.conv(64, 7, 2, name="stem_conv", symmetric=True)(inputs)
    else:
        x = blocks.conv(64, 3, name="stem_conv")(inputs)
    x = blocks.batch_norm("stem_bn", sync_bn)(x)
    x = layers.ReLU(name="stem_relu")(x)
    if stem == "imagenet":
        # Zero padding equals torch's -inf padding here: inputs are >= 0.
        x = layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
        x = layers.MaxPooling2D(3, 2, name="stem_pool")(x)
    x = blocks.stages(
        x,
        block,
        zip((64, 128, 256, 512), stage_sizes, strict=True),
        shortcut=shortcut,
        sync_bn=sync_bn,
        symmetric_padding=True,
        zero_init_residual=zero_init_residual,
    )
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=name or f"resnet{depth}")

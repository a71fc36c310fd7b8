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

Stems (`--stem`, see `resnet.stem`):
  "imagenet": 7x7/2 convolution and 3x3/2 max pool, for 224x224 inputs
    (`--image_size=224` upsamples CIFAR or TinyImageNet images).
  "cifar": a 3x3/1 convolution and no pool, for training 32x32 or 64x64
    images from scratch; ImageNet weights then no longer fit the stem.
"""

from tf_resnet.config.families import IMAGENET, IMAGENET_LAYOUTS
from tf_resnet.models import blocks, resnet

# The block kinds that `IMAGENET_LAYOUTS` names.
BLOCKS = {"basic": blocks.BasicBlock, "bottleneck": blocks.Bottleneck}


@resnet.builds(IMAGENET)
def imagenet_resnet(
    depth, num_classes, input_shape=(224, 224, 3), name=None, **options
):
    """Builds a torchvision-layout ResNet.

    Args:
      depth: a key of `IMAGENET_LAYOUTS`.
      num_classes: outputs of the classifier (logits, no softmax).
      input_shape: `(H, W, 3)`.
      name: model name; defaults to `resnet{depth}`.
      **options: `IMAGENET.takes` of `ModelOptions` (stem, shortcut, sync_bn,
        zero_init_residual; torchvision has a `zero_init_residual` too).

    Returns:
      A `keras.Model` mapping images to logits.
    """
    kind, stage_sizes = IMAGENET_LAYOUTS[depth]
    name = name or f"resnet{depth}"
    return resnet.resnet(
        resnet.stack(
            BLOCKS[kind],
            zip((64, 128, 256, 512), stage_sizes, strict=True),
            symmetric_padding=True,
        ),
        num_classes,
        input_shape,
        IMAGENET.resolve(name, options),
        name=name,
        stem_filters=64,
    )

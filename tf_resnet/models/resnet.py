"""The one ResNet builder every model family is a thin variant of.

A ResNet is a stem, a stack of stages of residual blocks, a final BN-ReLU
when the blocks are pre-activated, global pooling and a dense classifier
named `logits` (as in Keras' `applications.resnet.ResNet`). The families
differ only in the stack, the stem's width, the pooling and the
classifier's initializer; everything the user sets is a `ModelOptions`.

Layer names are part of the format: checkpoints, the torchvision weight
mapping (`pretrained`) and the head/backbone split of fine-tuning
(`tf_resnet.param_groups`) find variables by them. The order in which
layers are created is too: each initializer draws its seed when its layer
is created, so a reordering changes every initial weight.
"""

import keras
from keras import layers

from tf_resnet.models import blocks

# The classifier; every other layer is the backbone.
HEAD_LAYER = "logits"
POOLING = {
    "avg": layers.GlobalAveragePooling2D,
    "max": layers.GlobalMaxPooling2D,
}


# Each family's builder, registered where it is defined (`builds`), so
# the family table (`config.families`) has no second table to follow.
BUILDERS = {}


def builds(family):
    """Registers the decorated function as the builder of `family`'s models.

    Args:
      family: a `config.families.Family`; its `Variant`s' arguments are
        what the builder is called with, besides the model's sizes.

    Returns:
      The decorator, which hands the function back unchanged.
    """

    def register(function):
        BUILDERS[family] = function
        return function

    return register


def resnet(
    stack_fn,
    num_classes,
    input_shape,
    options,
    *,
    name,
    stem_filters,
    preact=False,
    pooling="avg",
    head_initializer="glorot_uniform",
):
    """Builds a ResNet from its stack of stages.

    Args:
      stack_fn: `stack_fn(x, options) -> x`, the residual stages.
      num_classes: outputs of the classifier (logits, no softmax).
      input_shape: `(H, W, 3)`.
      options: a `ModelOptions` (stem, dropout, batch norm sync).
      name: the model's name.
      stem_filters: output channels of the stem's convolution.
      preact: the blocks are pre-activated (ResNet v2): no BN-ReLU after the
        stem's convolution, one after the last stage instead.
      pooling: `"avg"` or `"max"` global pooling before the classifier.
      head_initializer: kernel initializer of the classifier.

    Returns:
      A `keras.Model` mapping images to logits.
    """
    inputs = keras.Input(shape=input_shape, name="images")
    x = stem(inputs, stem_filters, options, preact)
    x = stack_fn(x, options)
    if preact:
        x = blocks.batch_norm("final_bn", options.sync_bn)(x)
        x = layers.ReLU(name="final_relu")(x)
    x = POOLING[pooling](name="pool")(x)
    outputs = layers.Dense(
        num_classes, kernel_initializer=head_initializer, name=HEAD_LAYER
    )(x)
    return keras.Model(inputs, outputs, name=name)


def stem(inputs, filters, options, preact=False):
    """The layers before the first stage.

    `options.stem == "imagenet"`: a 7x7/2 convolution and a 3x3/2 max pool
    (4x fewer pixels, for 224x224 inputs), both padded symmetrically as in
    torchvision; `"cifar"`: one 3x3/1 convolution, for small images. Then
    BN-ReLU (unless the blocks are pre-activated) and, if
    `options.dropout_rate` is set, dropout.
    """
    if options.stem == "imagenet":
        x = blocks.conv(filters, 7, 2, name="stem_conv", symmetric=True)(inputs)
    else:
        x = blocks.conv(filters, 3, name="stem_conv")(inputs)
    if not preact:
        x = blocks.batch_norm("stem_bn", options.sync_bn)(x)
        x = layers.ReLU(name="stem_relu")(x)
    if options.dropout_rate is not None:
        x = layers.Dropout(options.dropout_rate, name="stem_dropout")(x)
    if options.stem == "imagenet":
        # Zero padding equals torch's -inf padding here: inputs are >= 0.
        x = layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
        x = layers.MaxPooling2D(3, 2, name="stem_pool")(x)
    return x


def stack(block, sizes, names=None, **block_kwargs):
    """The `stack_fn` of `blocks.stages` with the blocks' user options.

    Args:
      block: `blocks.BasicBlock` or `blocks.Bottleneck`.
      sizes: `(filters, num_blocks)` of each stage.
      names: the stages' layer names (default `stage1`, `stage2`, ...).
      **block_kwargs: what the family fixes for every block (`preact`,
        `symmetric_padding`), beside `ModelOptions.block_options()`.

    Returns:
      `stack_fn(x, options) -> x`.
    """
    sizes = tuple(sizes)

    def stack_fn(x, options):
        return blocks.stages(
            x,
            block,
            sizes,
            names,
            **block_kwargs,
            **options.block_options(),
        )

    return stack_fn

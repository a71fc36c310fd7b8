"""The ResNet of the course assignment (CIFAR-100 60%, TinyImageNet 50%).

A 3x3 convolution with 32 filters, batch norm, ReLU and dropout, then four
stages of basic blocks named as in the assignment's figure:

  conv2_x: 2 blocks of [3x3, 32; 3x3, 32]
  conv3_x: 4 blocks of 64, stride 2 in the first block
  conv4_x: 4 blocks of 128, stride 2 in the first block
  conv5_x: 2 blocks of 256, stride 2 in the first block

with a 1x1 projection shortcut wherever the shape changes, max pooling and a
fully connected classifier. The pooling is global, so the same weights work
for 32x32 (CIFAR, 4x4 final map) and 64x64 (TinyImageNet, 8x8) inputs, and
the classifier always reads 256 features.

Trainable parameters: 3,533,856 + 257 * num_classes, i.e. 3,559,556 for 100
classes and 3,585,256 for 200; batch norm adds 6,336 moving statistics
(derived layer by layer in docs/recipes.md, checked by
tests/test_course_models.py).
"""

import keras
from keras import layers

from tf_resnet.models import blocks

# (name, filters, blocks) of each stage, as in the assignment's figure.
STAGES = (
    ("conv2_x", 32, 2),
    ("conv3_x", 64, 4),
    ("conv4_x", 128, 4),
    ("conv5_x", 256, 2),
)


def course_resnet(
    num_classes,
    input_shape=(32, 32, 3),
    dropout_rate=0.2,
    shortcut="projection",
    sync_bn=False,
    zero_init_residual=False,
    name="course_resnet",
):
    """Builds the course ResNet.

    Args:
      num_classes: outputs of the classifier (logits, no softmax).
      input_shape: `(H, W, 3)`; 32x32 and 64x64 are the intended sizes.
      dropout_rate: dropout after the first convolution's ReLU, the only
        dropout of the assignment's network.
      shortcut: `"projection"` (the assignment's 1x1 conv) or `"zero_pad"`.
      sync_bn: synchronise batch statistics across replicas.
      zero_init_residual: every block starts as its shortcut (see
        `blocks`).
      name: model name.

    Returns:
      A `keras.Model` mapping images to logits.
    """
    inputs = keras.Input(shape=input_shape, name="images")
    x = blocks.conv(32, 3, name="stem_conv")(inputs)
    x = blocks.batch_norm("stem_bn", sync_bn)(x)
    x = layers.ReLU(name="stem_relu")(x)
    x = layers.Dropout(dropout_rate, name="stem_dropout")(x)
    for index, (stage_name, filters, num_blocks) in enumerate(STAGES):
        x = blocks.stage(
            blocks.BasicBlock,
            filters,
            num_blocks,
            strides=1 if index == 0 else 2,
            name=stage_name,
            shortcut=shortcut,
            sync_bn=sync_bn,
            zero_init_residual=zero_init_residual,
        )(x)
    x = layers.GlobalMaxPooling2D(name="pool")(x)
    outputs = layers.Dense(
        num_classes, kernel_initializer="he_normal", name="logits"
    )(x)
    return keras.Model(inputs, outputs, name=name)

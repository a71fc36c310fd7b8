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

from tf_resnet.config.families import COURSE
from tf_resnet.models import blocks, resnet

# (name, filters, blocks) of each stage, as in the assignment's figure.
STAGES = (
    ("conv2_x", 32, 2),
    ("conv3_x", 64, 4),
    ("conv4_x", 128, 4),
    ("conv5_x", 256, 2),
)


@resnet.builds(COURSE)
def course_resnet(
    num_classes, input_shape=(32, 32, 3), name="course_resnet", **options
):
    """Builds the course ResNet.

    Args:
      num_classes: outputs of the classifier (logits, no softmax).
      input_shape: `(H, W, 3)`; 32x32 and 64x64 are the intended sizes.
      name: model name.
      **options: `COURSE.takes` of `ModelOptions` (dropout_rate, shortcut,
        sync_bn, zero_init_residual).

    Returns:
      A `keras.Model` mapping images to logits.
    """
    return resnet.resnet(
        resnet.stack(
            blocks.BasicBlock,
            [(filters, num_blocks) for _, filters, num_blocks in STAGES],
            names=[stage_name for stage_name, _, _ in STAGES],
        ),
        num_classes,
        input_shape,
        COURSE.resolve(name, options),
        name=name,
        stem_filters=32,
        pooling="max",
        head_initializer="he_normal",
    )

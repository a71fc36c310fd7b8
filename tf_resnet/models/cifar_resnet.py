"""CIFAR ResNets of He et al. (2016), section 4.2, v1 and pre-activation v2.

6n+2 layers: a 3x3 conv with 16 filters, three stages of n basic blocks with
16, 32 and 64 filters (stride 2 at the start of stages 2 and 3), global
average pooling and a dense classifier. n = 3, 5, 7, 9, 18, 200 gives
ResNet-20/32/44/56/110/1202 with 0.27/0.46/0.66/0.85/1.7/19.4 M parameters
(Table 6 of the paper; checked by tests/test_models.py).

The paper's CIFAR default is the parameter-free zero-padding shortcut
(option A); `shortcut="projection"` gives option B. v2 (He et al.,
"Identity Mappings in Deep Residual Networks") uses pre-activation blocks and
a final BN-ReLU before pooling.
"""

import keras
from keras import layers

from tf_resnet.models import blocks


def cifar_resnet(
    depth,
    num_classes,
    input_shape=(32, 32, 3),
    version=1,
    shortcut="zero_pad",
    sync_bn=False,
    zero_init_residual=False,
    name=None,
):
    """Builds a 6n+2-layer CIFAR ResNet.

    Args:
      depth: total weighted layers, 6n+2 (20, 32, 44, 56, 110, 1202, ...).
      num_classes: outputs of the classifier (logits, no softmax).
      input_shape: `(H, W, 3)`; any size works, 32x32 is the reference.
      version: 1 (post-activation) or 2 (pre-activation).
      shortcut: `"zero_pad"` (option A) or `"projection"` (option B).
      sync_bn: synchronise batch statistics across replicas.
      zero_init_residual: every block starts as its shortcut (see
        `blocks`).
      name: model name; defaults to `resnet{depth}[_v2]`.

    Returns:
      A `keras.Model` mapping images to logits.
    """
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
    if version not in (1, 2):
        raise ValueError(f"version must be 1 or 2, got {version}")
    blocks_per_stage = (depth - 2) // 6
    preact = version == 2
    inputs = keras.Input(shape=input_shape, name="images")
    x = blocks.conv(16, 3, name="stem_conv")(inputs)
    if not preact:
        x = blocks.batch_norm("stem_bn", sync_bn)(x)
        x = layers.ReLU(name="stem_relu")(x)
    x = blocks.stages(
        x,
        blocks.BasicBlock,
        [(filters, blocks_per_stage) for filters in (16, 32, 64)],
        shortcut=shortcut,
        preact=preact,
        sync_bn=sync_bn,
        zero_init_residual=zero_init_residual,
    )
    if preact:
        x = blocks.batch_norm("final_bn", sync_bn)(x)
        x = layers.ReLU(name="final_relu")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = layers.Dense(
        num_classes, kernel_initializer="he_normal", name="logits"
    )(x)
    suffix = "_v2" if preact else ""
    return keras.Model(inputs, outputs, name=name or f"resnet{depth}{suffix}")

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

from tf_resnet.config.families import CIFAR
from tf_resnet.models import blocks, resnet


@resnet.builds(CIFAR)
def cifar_resnet(
    depth,
    num_classes,
    input_shape=(32, 32, 3),
    version=1,
    name=None,
    **options,
):
    """Builds a 6n+2-layer CIFAR ResNet.

    Args:
      depth: total weighted layers, 6n+2 (20, 32, 44, 56, 110, 1202, ...).
      num_classes: outputs of the classifier (logits, no softmax).
      input_shape: `(H, W, 3)`; any size works, 32x32 is the reference.
      version: 1 (post-activation) or 2 (pre-activation).
      name: model name; defaults to `resnet{depth}[_v2]`.
      **options: `CIFAR.takes` of `ModelOptions` (shortcut, sync_bn,
        zero_init_residual).

    Returns:
      A `keras.Model` mapping images to logits.
    """
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
    if version not in (1, 2):
        raise ValueError(f"version must be 1 or 2, got {version}")
    preact = version == 2
    name = name or f"resnet{depth}{'_v2' if preact else ''}"
    blocks_per_stage = (depth - 2) // 6
    return resnet.resnet(
        resnet.stack(
            blocks.BasicBlock,
            [(filters, blocks_per_stage) for filters in (16, 32, 64)],
            preact=preact,
        ),
        num_classes,
        input_shape,
        CIFAR.resolve(name, options),
        name=name,
        stem_filters=16,
        preact=preact,
        head_initializer="he_normal",
    )

"""Residual blocks shared by every ResNet in the package.

`BasicBlock` (two 3x3 convs) and `Bottleneck` (1x1, 3x3, 1x1 with 4x
expansion) are Keras layers, so a 1202-layer network is a short functional
graph of a few stages rather than thousands of nodes (Keras' graph walk is
recursive and overflows Python's stack on deep flat graphs). They are
registered Keras objects, so a saved `.keras` model loads wherever
`tf_resnet.models` has been imported.

Where the shape changes (stride 2 or a different channel count) the shortcut
is either a 1x1 strided projection + BN (`"projection"`, option B of the
paper, the torchvision default) or stride-2 subsampling with zero-padded
extra channels (`"zero_pad"`, option A, no parameters).

`zero_init_residual=True` starts the last batch norm of every residual
branch with gamma 0 (Goyal et al., 2017, "Accurate, Large Minibatch SGD"):
each block then begins as its shortcut, the network as a shallow one, which
tolerates the high learning rates of short schedules. A pre-activation block
ends in a convolution, not a batch norm, so there that convolution's kernel
starts at 0 instead.
"""

import keras
from keras import layers

from tf_resnet.models.fused_batch_norm import FusedBatchNormalization

BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


def conv(filters, kernel_size, strides=1, name=None, symmetric=False):
    """Bias-free 'same' convolution with He initialisation.

    `symmetric=True` pads a strided convolution by `kernel_size // 2` on
    every side, as torch does; Keras' 'same' puts all the padding of a
    stride-2 convolution of an even input on the bottom/right, which shifts
    every window by one pixel and breaks weights imported from torchvision.
    """
    if symmetric and strides > 1 and kernel_size > 1:
        return SymmetricPadConv2D(
            filters,
            kernel_size,
            strides=strides,
            use_bias=False,
            kernel_initializer="he_normal",
            name=name,
        )
    return layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        name=name,
    )


@keras.saving.register_keras_serializable(package="tf_resnet")
class SymmetricPadConv2D(layers.Conv2D):
    """A 'valid' convolution of the input zero-padded by `k // 2` per side."""

    def __init__(self, filters, kernel_size, **kwargs):
        kwargs["padding"] = "valid"
        super().__init__(filters, kernel_size, **kwargs)

    def _paddings(self):
        return [(k // 2, k // 2) for k in self.kernel_size]

    def call(self, inputs):
        """Pads the input symmetrically, then convolves without padding."""
        return super().call(
            keras.ops.pad(inputs, [(0, 0), *self._paddings(), (0, 0)])
        )

    def compute_output_shape(self, input_shape):
        """The 'valid' output shape of the padded input."""
        padded = [
            None if size is None else size + before + after
            for size, (before, after) in zip(
                input_shape[1:3], self._paddings(), strict=True
            )
        ]
        return super().compute_output_shape(
            (input_shape[0], *padded, input_shape[3])
        )


def batch_norm(name=None, sync=False, zero_gamma=False):
    """Batch norm with the momentum/epsilon of the reference implementations.

    `sync=True` all-reduces the batch statistics over the replicas of a
    `tf.distribute` strategy: every replica normalises with the statistics of
    the global batch, as a single device would. The layer runs TF's fused
    kernel, which trains faster on CPU (fused_batch_norm.py says why,
    bench/results/train_step.md has the numbers).
    `zero_gamma=True` starts the scale at 0 (the layer outputs beta, 0).
    """
    return FusedBatchNormalization(
        momentum=BN_MOMENTUM,
        epsilon=BN_EPSILON,
        synchronized=sync,
        gamma_initializer="zeros" if zero_gamma else "ones",
        name=name,
    )


@keras.saving.register_keras_serializable(package="tf_resnet")
class ZeroPadShortcut(layers.Layer):
    """Option-A shortcut: stride subsampling, zero-padded extra channels."""

    def __init__(self, out_channels, strides, **kwargs):
        super().__init__(**kwargs)
        self.out_channels = out_channels
        self.strides = strides

    def call(self, x, training=None):
        del training  # No state: the same in training and inference.
        x = self.subsample(x)
        extra = self.out_channels - x.shape[-1]
        return keras.ops.pad(
            x, [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]]
        )

    def subsample(self, x):
        """`x[:, ::s, ::s]`, computed as a 1x1 average pool with stride s.

        Same values and gradients, but the backward pass is a oneDNN
        pooling kernel instead of TensorFlow's StridedSliceGrad scatter,
        which makes the step faster (bench/results/train_step.md has the
        numbers).
        """
        return keras.ops.average_pool(x, 1, self.strides, padding="valid")

    def get_config(self):
        return {
            **super().get_config(),
            "out_channels": self.out_channels,
            "strides": self.strides,
        }


@keras.saving.register_keras_serializable(package="tf_resnet")
class ProjectionShortcut(layers.Layer):
    """Option-B shortcut: 1x1 strided convolution followed by batch norm."""

    def __init__(self, out_channels, strides, sync_bn=False, **kwargs):
        super().__init__(**kwargs)
        self.out_channels = out_channels
        self.strides = strides
        self.sync_bn = sync_bn
        self.conv = conv(out_channels, 1, strides, name="conv")
        self.bn = batch_norm("bn", sync_bn)

    def call(self, x, training=None):
        return self.bn(self.conv(x), training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "out_channels": self.out_channels,
            "strides": self.strides,
            "sync_bn": self.sync_bn,
        }


def make_shortcut(kind, in_channels, out_channels, strides, sync_bn):
    """The shortcut layer for a block, or `None` for a plain identity."""
    if strides == 1 and in_channels == out_channels:
        return None
    if kind == "zero_pad":
        return ZeroPadShortcut(out_channels, strides, name="shortcut")
    if kind == "projection":
        return ProjectionShortcut(
            out_channels, strides, sync_bn, name="shortcut"
        )
    raise ValueError(f"shortcut must be 'zero_pad' or 'projection': {kind!r}")


class _ResidualBlock(layers.Layer):
    """The options every residual block takes, kept for `get_config`."""

    def __init__(
        self,
        filters,
        strides=1,
        shortcut="projection",
        sync_bn=False,
        symmetric_padding=False,
        zero_init_residual=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.filters = filters
        self.strides = strides
        self.shortcut_kind = shortcut
        self.sync_bn = sync_bn
        self.symmetric_padding = symmetric_padding
        self.zero_init_residual = zero_init_residual

    def get_config(self):
        return {
            **super().get_config(),
            "filters": self.filters,
            "strides": self.strides,
            "shortcut": self.shortcut_kind,
            "sync_bn": self.sync_bn,
            "symmetric_padding": self.symmetric_padding,
            "zero_init_residual": self.zero_init_residual,
        }


@keras.saving.register_keras_serializable(package="tf_resnet")
class BasicBlock(_ResidualBlock):
    """Two 3x3 convolutions with a residual connection.

    Args:
      filters: output channels.
      strides: stride of the first convolution (and of the shortcut).
      shortcut: `"projection"` or `"zero_pad"`, used on a shape change.
      preact: pre-activation ordering (ResNet v2): BN-ReLU before each conv,
        no ReLU after the addition.
      sync_bn: synchronised batch statistics across replicas.
      symmetric_padding: pad the strided 3x3 convolution like torch
        (see `conv`), for weights imported from torchvision.
      zero_init_residual: start the residual branch at 0 (the last batch
        norm's gamma; the last convolution's kernel of a pre-activation
        block), so that the block starts as its shortcut.
    """

    expansion = 1

    def __init__(
        self,
        filters,
        strides=1,
        shortcut="projection",
        preact=False,
        sync_bn=False,
        symmetric_padding=False,
        zero_init_residual=False,
        **kwargs,
    ):
        super().__init__(
            filters,
            strides,
            shortcut,
            sync_bn,
            symmetric_padding,
            zero_init_residual,
            **kwargs,
        )
        self.preact = preact
        self.conv1 = conv(
            filters, 3, strides, name="conv1", symmetric=symmetric_padding
        )
        self.bn1 = batch_norm("bn1", sync_bn)
        self.conv2 = conv(filters, 3, name="conv2")
        if zero_init_residual and preact:
            self.conv2.kernel_initializer = keras.initializers.Zeros()
        self.bn2 = batch_norm(
            "bn2", sync_bn, zero_gamma=zero_init_residual and not preact
        )

    def build(self, input_shape):
        self.shortcut = make_shortcut(
            self.shortcut_kind,
            input_shape[-1],
            self.filters * self.expansion,
            self.strides,
            self.sync_bn,
        )

    def call(self, x, training=None):
        if self.preact:
            return self._call_preact(x, training)
        residual = (
            x if self.shortcut is None else self.shortcut(x, training=training)
        )
        y = keras.ops.relu(self.bn1(self.conv1(x), training=training))
        y = self.bn2(self.conv2(y), training=training)
        return keras.ops.relu(y + residual)

    def _call_preact(self, x, training):
        pre = keras.ops.relu(self.bn1(x, training=training))
        # A projection reads the pre-activated input, as in He et al. v2.
        residual = (
            x
            if self.shortcut is None
            else self.shortcut(pre, training=training)
        )
        y = self.conv1(pre)
        y = self.conv2(keras.ops.relu(self.bn2(y, training=training)))
        return y + residual

    def get_config(self):
        return {**super().get_config(), "preact": self.preact}


@keras.saving.register_keras_serializable(package="tf_resnet")
class Bottleneck(_ResidualBlock):
    """1x1 reduce, 3x3, 1x1 expand (x4) with a residual connection.

    The stride sits on the 3x3 convolution (the torchvision "ResNet v1.5"
    placement). Args as `BasicBlock`; output channels are `4 * filters`.
    """

    expansion = 4

    def __init__(self, filters, strides=1, **options):
        super().__init__(filters, strides, **options)
        sync_bn = self.sync_bn
        self.conv1 = conv(filters, 1, name="conv1")
        self.bn1 = batch_norm("bn1", sync_bn)
        self.conv2 = conv(
            filters, 3, strides, name="conv2", symmetric=self.symmetric_padding
        )
        self.bn2 = batch_norm("bn2", sync_bn)
        self.conv3 = conv(filters * self.expansion, 1, name="conv3")
        self.bn3 = batch_norm(
            "bn3", sync_bn, zero_gamma=self.zero_init_residual
        )

    build = BasicBlock.build

    def call(self, x, training=None):
        residual = (
            x if self.shortcut is None else self.shortcut(x, training=training)
        )
        y = keras.ops.relu(self.bn1(self.conv1(x), training=training))
        y = keras.ops.relu(self.bn2(self.conv2(y), training=training))
        y = self.bn3(self.conv3(y), training=training)
        return keras.ops.relu(y + residual)


def stage(block, filters, num_blocks, strides, name, **block_options):
    """A `keras.Sequential` of `num_blocks` blocks; the first one strides."""
    return keras.Sequential(
        [
            block(
                filters,
                strides if index == 0 else 1,
                name=f"block{index}",
                **block_options,
            )
            for index in range(num_blocks)
        ],
        name=name,
    )


def stages(x, block, sizes, names=None, **block_options):
    """Applies one `stage` per `(filters, num_blocks)` of `sizes` to `x`.

    The layout every ResNet of the paper shares: the first stage keeps the
    resolution, each later one halves it (stride 2 on its first block).
    Stages are named `names`, by default `stage1`, `stage2`, ..., the names
    weight import maps.
    """
    sizes = list(sizes)
    if names is None:
        names = [f"stage{index + 1}" for index in range(len(sizes))]
    for index, ((filters, num_blocks), name) in enumerate(
        zip(sizes, names, strict=True)
    ):
        x = stage(
            block,
            filters,
            num_blocks,
            strides=1 if index == 0 else 2,
            name=name,
            **block_options,
        )(x)
    return x

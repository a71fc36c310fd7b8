"""Keras batch normalization computed by TensorFlow's fused kernel.

Keras 3's `BatchNormalization` is backend-neutral: mean, variance,
normalisation and their gradients are a dozen separate element-wise ops,
each a pass over the activation, and under mixed precision it upcasts to
float32 and back. TensorFlow's `FusedBatchNormV3` does the forward pass in
one kernel and the backward pass in another (oneDNN on CPUs, cuDNN on
GPUs), in bfloat16/float16 with float32 statistics, so far fewer passes
over the activations: the training step is faster, most of all under mixed
precision (bench/results/train_step.md, "What each change moved", has
the measured speed-ups).

`FusedBatchNormalization` is a drop-in subclass: the same variables, names,
checkpoints and semantics (biased batch variance in the moving average,
moving statistics in inference mode and for frozen layers). It falls back to
the Keras computation wherever the fused kernel does not apply: synchronized
(cross-replica) statistics, masks, renormalisation, float64, or a channel
axis other than the last of a 4-D input.
"""

import keras
import tensorflow as tf
from keras import layers

_FUSED_DTYPES = (tf.float16, tf.bfloat16, tf.float32)


@keras.saving.register_keras_serializable(package="tf_resnet")
class FusedBatchNormalization(layers.BatchNormalization):
    """`keras.layers.BatchNormalization` on `tf.nn.fused_batch_norm`."""

    def _fusable(self, inputs, mask):
        rank = len(inputs.shape)
        return (
            rank == 4
            and self.axis in (-1, rank - 1)
            and mask is None
            and not self.synchronized
            and not self.renorm
            and tf.as_dtype(inputs.dtype) in _FUSED_DTYPES
        )

    def call(self, inputs, training=None, mask=None):
        if not self._fusable(inputs, mask):
            return super().call(inputs, training=training, mask=mask)
        channels = inputs.shape[-1]
        gamma = (
            tf.cast(self.gamma, tf.float32)
            if self.scale
            else tf.ones([channels], tf.float32)
        )
        beta = (
            tf.cast(self.beta, tf.float32)
            if self.center
            else tf.zeros([channels], tf.float32)
        )
        # tf.nn raises epsilon to at least 1.001e-5 (cuDNN's minimum plus
        # rounding room): 1e-5 becomes 1.001e-5, a 0.1% change of epsilon.
        if training and self.trainable:
            outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                inputs, gamma, beta, epsilon=self.epsilon, is_training=True
            )
            # The kernel returns the unbiased (n-1) variance; Keras keeps the
            # biased one in its moving average.
            count = tf.cast(tf.size(inputs) // channels, tf.float32)
            variance *= (count - 1.0) / count
            momentum = self.momentum
            self.moving_mean.assign(
                self.moving_mean * momentum + mean * (1.0 - momentum)
            )
            self.moving_variance.assign(
                self.moving_variance * momentum + variance * (1.0 - momentum)
            )
        else:
            outputs, _, _ = tf.compat.v1.nn.fused_batch_norm(
                inputs,
                gamma,
                beta,
                mean=tf.cast(self.moving_mean, tf.float32),
                variance=tf.cast(self.moving_variance, tf.float32),
                epsilon=self.epsilon,
                is_training=False,
            )
        return tf.cast(outputs, self.compute_dtype)

"""zero_init_residual: every residual branch starts at zero."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import sgd_step
from tf_resnet.models import blocks, build_model, cifar_resnet

CASES = [
    ("resnet20", (32, 32, 3), {}, "bn2/gamma"),
    ("course_resnet", (32, 32, 3), {}, "bn2/gamma"),
    ("resnet50", (32, 32, 3), {"stem": "cifar"}, "bn3/gamma"),
    ("resnet20_v2", (32, 32, 3), {}, "conv2/kernel"),
]


def weights(name, shape, options, seed=3, **extra):
    keras.utils.set_random_seed(seed)
    model = build_model(name, 10, shape, **options, **extra)
    return {v.path: v.numpy() for v in model.weights}


@pytest.mark.parametrize("name, shape, options, last", CASES)
def test_last_of_each_branch_is_zero_and_the_rest_unchanged(
    name, shape, options, last
):
    default = weights(name, shape, options)
    explicit = weights(name, shape, options, zero_init_residual=False)
    zeroed = weights(name, shape, options, zero_init_residual=True)
    assert default.keys() == explicit.keys() == zeroed.keys()
    for path in default:
        np.testing.assert_array_equal(default[path], explicit[path])
    branch_ends = [p for p in zeroed if "/block" in p and p.endswith(last)]
    blocks_count = len({p.rsplit("/", 2)[0] for p in branch_ends})
    assert blocks_count == len(branch_ends) >= 4
    for path, value in zeroed.items():
        if path in branch_ends:
            assert not value.any(), path
            assert default[path].any(), path
        else:  # Same random draws for every other variable.
            np.testing.assert_array_equal(value, default[path], err_msg=path)


@pytest.mark.parametrize("shortcut", ["projection", "zero_pad"])
@pytest.mark.parametrize("preact", [False, True])
@pytest.mark.parametrize("strides, channels", [(1, 8), (2, 4)])
def test_basic_block_starts_as_its_shortcut(
    shortcut, preact, strides, channels
):
    block = blocks.BasicBlock(
        8, strides, shortcut, preact=preact, zero_init_residual=True
    )
    x = tf.random.stateless_normal([2, 6, 6, channels], [0, 1])
    for training in (False, True):
        out = block(x, training=training)
        if preact:
            pre = tf.nn.relu(block.bn1(x, training=training))
            source = pre if block.shortcut is not None else x
        else:
            source = x
        residual = (
            source
            if block.shortcut is None
            else block.shortcut(source, training=training)
        )
        expected = residual if preact else tf.nn.relu(residual)
        np.testing.assert_array_equal(out, expected)
        assert np.abs(expected.numpy()).max() > 0
    config = block.get_config()
    assert config["zero_init_residual"] is True
    assert blocks.BasicBlock.from_config(config).zero_init_residual


def test_bottleneck_starts_as_its_shortcut():
    block = blocks.Bottleneck(4, 2, zero_init_residual=True)
    x = tf.random.stateless_normal([2, 6, 6, 8], [2, 3])
    out = block(x, training=True)
    np.testing.assert_array_equal(
        out, tf.nn.relu(block.shortcut(x, training=True))
    )


def test_training_moves_the_zeroed_gammas():
    keras.utils.set_random_seed(0)
    model = cifar_resnet.cifar_resnet(8, 10, (8, 8, 3), zero_init_residual=True)
    optimizer = keras.optimizers.SGD(0.1)
    images = tf.random.stateless_normal([8, 8, 8, 3], [4, 5])
    labels = tf.range(8) % 10
    sgd_step(model, optimizer, images, labels)
    gammas = [v for v in model.weights if v.path.endswith("bn2/gamma")]
    assert gammas and all(np.abs(g.numpy()).max() > 0 for g in gammas)
